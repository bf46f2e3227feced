"""Run a script (or ``-m module``) with every model the process loads wholly on the GPU, as the tests' GPU plugin
does (tests/support/gpu_offload.py): ``python bench/gpu/offloaded.py bench/perf_loop_overhead.py --no-starter``,
``python bench/gpu/offloaded.py -m app.cli.main bench --target T.gguf --draft D.gguf ...``."""
import runpy
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root), str(root / "tests")]
from support.gpu_offload import loads  # noqa: E402  (importing it patches llama_model_load_from_file)

try:
    if sys.argv[1] == "-m":
        sys.argv = [sys.argv[2]] + sys.argv[3:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print(f"gpu_offload: {loads[0]} models loaded with every layer offloaded", file=sys.stderr)
