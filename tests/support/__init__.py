"""Helpers the tests share, none of them tests themselves: tiny GGUF models written on the spot (tiny_gguf, and
tiny_recurrent, tiny_eagle3, tiny_gemma4 built on it), a local stand-in for the Hugging Face Hub (fake_hub), servers
started as a person starts them (servers; llama.cpp's llama-server built from the pinned sdist in llama_server, that
sdist read by llama_sdist, builds of it cached by llama_build; its libraries built for Vulkan, to run on lavapipe, in
vulkan_build), a launcher that logs any connection beyond loopback (net_guard, run as a script), and
the hidden-state head drafters with the tiny models each drafts for (heads). Imported as ``support.<module>``
(conftest.py puts tests/ on the path)."""
import os
from pathlib import Path

# Where runs leave what a person looks at afterwards: screenshots, logs, every test's durations.
ARTIFACTS = Path(os.environ.get("SPECCHAT_ARTIFACTS", Path(__file__).resolve().parent.parent / "artifacts"))
