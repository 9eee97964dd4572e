"""Property-based fuzzing of fused_moe on the CPU: routing plan invariants (every valid (token, slot) placed once,
contiguous ranges, stable order), the plan-driven emulation vs a direct per-token loop, emulation vs exact.
Budget: tests/fuzz_profiles.py."""

from fuzz_profiles import fuzz_test

test_fuzz_fused_moe = fuzz_test("fused_moe")


def test_stage_checks_pass_the_contract_and_catch_faults():
    """The GPU fuzzer's staged checks (stage_errors / stage_failures) on buffers the emulation itself wrote: all
    clean; then one fault per stage (an act row scaled, an aq byte two steps off, a ybuf row changed, an out bit
    flipped) fails exactly its stage's check, both scale formats."""
    import torch

    from hotpaths.bench import fused_moe_fuzz as fz
    from hotpaths.reference import fused_moe as fm

    for scales in ("pertensor", "block"):
        cfg = dict(tokens=40, mode="tp8ep1", experts=8, topk=4, rank=0, hidden=256, inter=192, scales=scales,
                   routing="random", block_m=16, spare_tokens=0, seed=3)
        inp = fz.make_inputs(cfg)
        args, kw = fm.call_args(inp)
        plan = fm.build_routing_plan(inp["topk_ids"], num_experts=inp["num_experts"])
        st = fm.fused_moe_emulation(*args, **kw, return_stages=True, plan=plan)
        nv = plan.num_valid
        sp = torch.from_numpy(plan.sorted_pairs[:nv].astype("int64"))
        act = st["act"][sp].clone()
        aq = st["aq"][sp].view(torch.uint8).clone()
        asc = st["a_scale"][sp].clone() if scales == "block" else torch.zeros(nv, 2)
        ybuf, out = st["ybuf"].clone(), st["out"].clone()

        def fails(a=act, q=aq, y=ybuf, o=out):
            m = fz.stage_errors(inp, plan, st, a, q, asc, y, o)
            return fz.stage_failures(m, scales), m

        bad, m = fails()
        assert not bad and m["aq_mismatch"] == 0 and m["reduce_bits"] == 0 and m["aq_flips"] == 0, (scales, bad)
        assert m["act_elems"] == nv * 192 >= fz.E2E_MIN_ELEMS
        a2 = act.clone()
        a2[3] *= 1.5
        assert any("gate-up act" in b for b in fails(a=a2)[0]), scales
        q2 = aq.clone()
        j = int(torch.nonzero(q2[0] & 0x78).flatten()[0])  # a normal e4m3 value: +2 in the code is 2 steps
        q2[0, j] += 2
        assert any("aq vs quant" in b for b in fails(q=q2)[0]), scales
        y2 = ybuf.clone()
        y2[int(sp[0])] *= -1
        assert any("down ybuf" in b for b in fails(y=y2)[0]), scales
        o2 = out.clone()
        o2.view(torch.int16)[0, 0] ^= 1
        got = fails(o=o2)[0]
        assert len(got) == 1 and "combine" in got[0], (scales, got)
