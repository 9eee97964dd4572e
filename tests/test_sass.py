"""hotpaths.harness.sass: cuobjdump's SASS parsed into instructions, loops and instruction mixes (no GPU)."""

import os
import shutil

import pytest

from hotpaths.harness import sass
from hotpaths.harness.cli import main

# cuobjdump -sass layout (trimmed): a function with a setup block, a loop whose fast path jumps forward to the
# latch (an epilogue placed inline), and a second function without a loop.
CANNED = """
Fatbin elf code:
================
arch = sm_90a
		Function : _Z4loopPf
	.headerflags	@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
                                                                               /* 0x000fe20000000800 */
        /*0010*/                   S2R R2, SR_TID.X ;                          /* 0x0000000000027919 */
        /*0020*/                   IMAD.MOV.U32 R3, RZ, RZ, RZ ;
        /*0030*/                   HGMMA.64x128x16.F32 R24, R120, gdesc[UR4], R24 ;
        /*0040*/                   FFMA R4, R4, R5, R6 ;
        /*0050*/              @!P0 BRA 0x80 ;
        /*0060*/                   STG.E desc[UR4][R8.64], R4 ;
        /*0070*/                   LDS R9, [R10] ;
        /*0080*/                   ISETP.GE.AND P0, PT, R3, R7, PT ;
        /*0090*/              @!P0 BRA 0x30 ;
        /*00a0*/                   BRA 0x60 ;
        /*00b0*/                   EXIT ;
        /*00c0*/                   BRA 0xc0;
		Function : _Z4flatPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   EXIT ;
"""


def test_parse_functions_predicates_and_branch_targets():
    funcs = sass.parse(CANNED)
    assert list(funcs) == ["_Z4loopPf", "_Z4flatPf"]
    ins = funcs["_Z4loopPf"]
    assert [i.addr for i in ins[:3]] == [0x0, 0x10, 0x20]
    br = ins[5]
    assert (br.pred, br.op, br.family, br.branch_target()) == ("@!P0", "BRA", "BRA", 0x80)
    assert ins[2].op == "IMAD.MOV.U32" and ins[2].family == "IMAD" and ins[2].branch_target() is None
    assert len(funcs["_Z4flatPf"]) == 2


def test_loops_main_loop_and_mix():
    ins = sass.parse(CANNED)["_Z4loopPf"]
    lps = sass.loops(ins)
    # 0x90 -> 0x30 and 0xa0 -> 0x60 are loops; the self-branch at 0xc0 (the trap after EXIT) is one too
    assert sass.Loop(0x30, 0x90) in lps and sass.Loop(0x60, 0xa0) in lps and sass.Loop(0xc0, 0xc0) in lps
    main_lp = sass.main_loop(ins)  # the only range holding the HGMMA
    assert main_lp == sass.Loop(0x30, 0x90)
    m = sass.mix(main_lp.body(ins))
    assert m["instructions"] == 7
    assert m["groups"] == {"tensor": 1, "float": 1, "control": 2, "memory": 2, "integer": 1}
    assert m["families"]["BRA"] == 2 and sum(m["families"].values()) == 7
    with pytest.raises(ValueError, match="no backward branch"):
        sass.main_loop(sass.parse(CANNED)["_Z4flatPf"])


def test_main_loop_prefers_the_tightest_range_with_the_tensor_work():
    # two back edges to one head (fast path and the epilogue's): the shorter range is the steady-state iteration
    text = "\t\tFunction : f\n" + "\n".join(
        f"        /*{a:04x}*/                   {t} ;" for a, t in
        [(0x00, "NOP"), (0x10, "QGMMA.64x64x32.F32.E4M3.E4M3 R88, gdesc[UR4], RZ"), (0x20, "@P0 BRA 0x10"),
         (0x30, "STG.E desc[UR4][R2.64], R4"), (0x40, "BRA 0x10"), (0x50, "EXIT")])
    ins = sass.parse(text)["f"]
    assert sass.main_loop(ins) == sass.Loop(0x10, 0x20)


def test_group_of_covers_the_families_the_kernels_use():
    assert sass.group_of("QGMMA") == "tensor" and sass.group_of("HMMA") == "tensor"
    assert sass.group_of("LDGSTS") == "memory" and sass.group_of("SHFL") == "memory"
    assert sass.group_of("WARPGROUP") == "sync" and sass.group_of("DEPBAR") == "sync"
    assert sass.group_of("MUFU") == "float" and sass.group_of("F2FP") == "float"
    assert sass.group_of("IMAD") == "integer" and sass.group_of("PRMT") == "integer"


def test_find_function_names_the_candidates():
    funcs = sass.parse(CANNED)
    assert sass.find_function(funcs, "loop")[0] == "_Z4loopPf"
    assert sass.find_function(funcs, "_Z4flatPf")[0] == "_Z4flatPf"
    with pytest.raises(ValueError, match=r"(?s)2 functions match 'Pf'.*_Z4loopPf"):
        sass.find_function(funcs, "Pf")
    with pytest.raises(ValueError, match="no function match 'nothere'"):
        sass.find_function(funcs, "nothere")


def test_disassemble_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="lib: no such file"):
        sass.disassemble(tmp_path / "missing.so")
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"not an elf")
    monkeypatch.setenv("HOTPATHS_CUOBJDUMP", str(tmp_path / "no-cuobjdump"))
    assert sass.find_cuobjdump() is None
    with pytest.raises(FileNotFoundError, match="cuobjdump not found"):
        sass.disassemble(lib)
    fake = tmp_path / "cuobjdump"
    fake.write_text("#!/bin/sh\necho 'cuobjdump fatal : not an ELF file' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("HOTPATHS_CUOBJDUMP", str(fake))
    with pytest.raises(RuntimeError, match="failed \\(exit 1\\): cuobjdump fatal : not an ELF file"):
        sass.disassemble(lib)


def _tool():
    tool = sass.find_cuobjdump()
    if tool is None and os.environ.get("CI"):
        pytest.fail("cuobjdump not found although `make setup` installs the nvidia-cuda-cuobjdump wheel")
    return tool


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: no kernel library to disassemble")
def test_real_kernel_mix_and_the_cli(capsys):
    if _tool() is None:
        pytest.skip("cuobjdump not found ($HOTPATHS_CUOBJDUMP, PATH, the nvidia-cuda-cuobjdump wheel)")
    m = sass.kernel_mix("split_kv_decode", r"TraitsWgILi3ELi2", loop=True)
    assert "TraitsWg" in m["function"] and m["range"] is not None
    # the warpgroup body's tile loop: 4 e4m3 QK wgmma (k32 steps) and 4 f16 PV wgmma (k16 steps) per 64-token tile
    assert m["families"].get("QGMMA") == 4 and m["families"].get("HGMMA") == 4
    assert m["groups"]["tensor"] == 8 and m["instructions"] > 100
    assert main(["sass", "split_kv_decode", "--kernel", "TraitsWgILi3ELi2", "--loop", "--json"]) == 0
    assert '"QGMMA": 4' in capsys.readouterr().out
    assert main(["sass", "no_such_op", "--kernel", "x"]) == 2
    assert "op: expected one of" in capsys.readouterr().err
    assert main(["sass", "split_kv_decode", "--kernel", "NoSuchKernelName"]) == 2
    assert "no function match" in capsys.readouterr().err
