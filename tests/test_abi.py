"""The structs SpecChat hands llama.cpp by value, as llama-cpp-python's ctypes bindings declare them, against the
llama.cpp headers they were written for (the pinned sdist's vendored copy), compiled here with the C compiler that
built llama.cpp: the same size, and every field at the same offset. A binding one field off shifts each field after
it, so llama.cpp would read ``n_gpu_layers`` or a callback from other bytes and fail far from the cause (a load with
layers offloaded segfaulted on an H200, docs/benchmarks.md): this rules that out on every run."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import tarfile

import pytest

import llama_cpp.llama_cpp as ll
import llama_cpp.mtmd_cpp as mt

from support import llama_sdist

# (C header, struct name, the ctypes class) for each struct passed by value or filled in by SpecChat
STRUCTS = [("llama.h", "llama_model_params", ll.llama_model_params),
           ("llama.h", "llama_context_params", ll.llama_context_params),
           ("llama.h", "llama_batch", ll.llama_batch),
           ("llama.h", "llama_model_quantize_params", ll.llama_model_quantize_params),
           ("llama.h", "llama_sampler_chain_params", ll.llama_sampler_chain_params),
           ("mtmd.h", "mtmd_context_params", mt.mtmd_context_params)]
HEADERS = ("vendor/llama.cpp/include/", "vendor/llama.cpp/ggml/include/", "vendor/llama.cpp/tools/mtmd/mtmd.h")


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    """{struct: (sizeof, {field: offsetof})} as the C compiler lays them out from the vendored headers."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler: llama-cpp-python's build needs one too"
    work = tmp_path_factory.mktemp("abi")
    with tarfile.open(llama_sdist.path()) as tar:
        top = tar.getnames()[0].split("/")[0]
        wanted = tuple(f"{top}/{h}" for h in HEADERS)
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(wanted) and m.name.endswith(".h")]
        for m in members:
            m.name = m.name.rsplit("/", 1)[1]  # every header in one folder
        tar.extractall(work, members=members, filter="data")
    lines = [f'printf("{name} {{}} %zu\\n", sizeof(struct {name}));' for _, name, _ in STRUCTS]
    lines += [f'printf("{name} {field} %zu\\n", offsetof(struct {name}, {field}));'
              for _, name, cls in STRUCTS for field, *_ in cls._fields_]
    includes = "".join(f'#include "{h}"\n' for h in sorted({h for h, _, _ in STRUCTS}))
    (work / "layout.c").write_text("#include <stddef.h>\n#include <stdio.h>\n" + includes + "int main(void) {\n"
                                   + "\n".join(lines) + "\nreturn 0;\n}\n")
    built = subprocess.run([cc, "-I", str(work), "-o", str(work / "layout"), str(work / "layout.c")],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]  # (a field the binding names and the header lacks fails here)
    layout: dict[str, tuple[int, dict[str, int]]] = {}
    for line in subprocess.run([str(work / "layout")], capture_output=True, text=True, check=True).stdout.split("\n"):
        if line:
            name, field, value = line.split()
            size, fields = layout.get(name, (0, {}))
            layout[name] = (int(value), fields) if field == "{}" else (size, {**fields, field: int(value)})
    return layout


@pytest.mark.parametrize("header, name, cls", STRUCTS, ids=[s[1] for s in STRUCTS])
def test_each_struct_has_the_headers_size_and_every_field_its_offset(c_layout, header, name, cls):
    size, offsets = c_layout[name]
    assert ctypes.sizeof(cls) == size, f"{name}: ctypes says {ctypes.sizeof(cls)} bytes, {header} {size}"
    ours = {field: getattr(cls, field).offset for field, *_ in cls._fields_}
    assert ours == offsets
    assert offsets  # (a struct the program printed no fields of would prove nothing)


def test_the_model_params_offload_field_sits_where_llama_cpp_reads_it(c_layout):
    """The field behind -ngl, written through the binding and read back as the header places it."""
    params = ll.llama_model_default_params()
    params.n_gpu_layers = 999
    offset = c_layout["llama_model_params"][1]["n_gpu_layers"]
    assert ctypes.c_int32.from_buffer_copy(bytes(params), offset).value == 999
