"""SpecChat: local chat with speculative decoding on llama.cpp."""
