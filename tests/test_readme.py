"""The README's set-up commands: the two that CI and a newcomer run, and the GPU lines, which must stay the launch
command with one GPU switch added (and -DGGML_LLAMAFILE=OFF kept), the same switches the app's rebuild advice gives,
each with a pip cache of its own (pip keys a built wheel by its source, not by CMAKE_ARGS)."""
import re
from pathlib import Path

from app.models.hardware import CMAKE_SWITCH

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def block(marker: str) -> list[str]:
    found = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)```", README, re.S)
    assert found, f"README.md has no ```bash block under <!-- {marker} -->"
    return [line.split("  #")[0].strip() for line in found.group(1).splitlines() if line.strip()]


def test_one_launch_and_one_test_command_both_keeping_exact_kernels():
    (launch,), (tests,) = block("launch-command"), block("test-command")
    assert launch.endswith(".venv/bin/specchat") and tests.endswith("python -m pytest")
    assert 'CMAKE_ARGS="-DGGML_LLAMAFILE=OFF"' in launch and 'CMAKE_ARGS="-DGGML_LLAMAFILE=OFF"' in tests
    assert "--cache-dir ~/.cache/specchat/pip-cpu " in launch and "--cache-dir ~/.cache/specchat/pip-cpu " in tests


def test_one_gpu_line_per_backend_each_the_launch_command_with_its_switch():
    (launch,) = block("launch-command")
    lines = block("gpu-commands")
    assert len(lines) == len(CMAKE_SWITCH) == 3
    for line, (backend, switch) in zip(lines, CMAKE_SWITCH.items()):
        assert line == launch.replace('CMAKE_ARGS="-DGGML_LLAMAFILE=OFF"', f'CMAKE_ARGS="{switch} -DGGML_LLAMAFILE=OFF"'
                                      ).replace("specchat/pip-cpu ", f"specchat/pip-{backend.lower()} ")
