"""A pytest plugin for GPU machines: every model the tests load goes wholly onto the GPU (llama.cpp's -ngl 999).

    python -m pytest -p tests.support.gpu_offload tests/test_engine.py tests/test_heads.py ...

On a CPU build it changes nothing. docs/benchmarks.md ("On a GPU") has what it showed on an H100.
"""
import llama_cpp.llama_cpp as ll

_load = ll.llama_model_load_from_file
loads = [0]


def _offloaded(path, params):
    if not params.vocab_only:
        params.n_gpu_layers = 999
        loads[0] += 1
    return _load(path, params)


ll.llama_model_load_from_file = _offloaded


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"gpu_offload: {loads[0]} models loaded with every layer offloaded "
                                f"(GPU offload {'supported' if ll.llama_supports_gpu_offload() else 'not in this build'})")
