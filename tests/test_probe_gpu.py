import pytest
import torch

pytestmark = pytest.mark.gpu


def test_probe_copy_exact_eager_pdl_graph():
    from hotpaths.kernels.probe import probe_copy

    for n in (1, 15, 16, 4097, (8 << 20) + 3):
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
        dst = torch.full_like(src, 0xAB)
        probe_copy(dst, src, pdl=True)
        torch.cuda.synchronize()
        assert torch.equal(dst, src), n
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        probe_copy(dst, src)
    src.random_(0, 255)
    dst.fill_(0xAB)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(dst, src)


def test_probe_rejects_bad_input():
    from hotpaths.kernels.probe import probe_copy

    a = torch.zeros(64, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="dst: expected 64 bytes"):
        probe_copy(torch.zeros(63, dtype=torch.uint8, device="cuda"), a)
    with pytest.raises(ValueError, match="alignment"):
        probe_copy(a[1:17], a[16:32])
    with pytest.raises(ValueError, match="CUDA tensor"):
        probe_copy(torch.zeros(64, dtype=torch.uint8), a)


def test_probe_near_copy_ceiling():
    from hotpaths.harness import ceilings

    c = ceilings.measure(copy_bytes=1 << 30, mm=4096, iters=10)
    assert c["probe_gbps"] > 0.85 * c["copy_gbps"], c
