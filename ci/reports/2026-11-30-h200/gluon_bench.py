"""Times the Gluon DSV4 prototype (gluon_dsv4.py) against fmha's Triton kernel on DSV4 decode, with cosine
against float64: `PYTHONPATH=$PWD python ci/reports/2026-11-30-h200/gluon_bench.py` on a Hopper GPU."""
import importlib.util, os, time, torch
from fmha.bench import SPEED_SHAPES, _inputs, time_us
from fmha.triton_attention import attention
spec = importlib.util.spec_from_file_location("g", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gluon_dsv4.py")); g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g)
shape = SPEED_SHAPES[0]
q, k, v = _inputs(shape)
qd, kd = q.double(), k.double()
s = torch.einsum("bthd,bshd->bhts", qd, kd.expand(-1, -1, shape.Hq, -1)) * shape.D ** -0.5
ref = torch.einsum("bhts,bshd->bthd", s.softmax(-1), kd.expand(-1, -1, shape.Hq, -1))
out = torch.empty_like(q)
lines = []
def report(name, fn):
    try:
        t0 = time.time(); fn(); torch.cuda.synchronize(); c = time.time() - t0
        cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0).item()
        err = (out.double() - ref).abs().max().item()
        us = time_us(fn)
        line = f"{name:34s} {us:8.1f} us  cos {cos:.8f}  maxerr {err:.3e}  compile {c:.1f}s"
    except Exception as e:
        line = f"{name:34s} FAILED {type(e).__name__}: {str(e)[:300]}"
    print(line, flush=True); lines.append(line)
report("triton (committed)", lambda: attention(q, k, k, out=out))
for bn, st in ((32, 3), (16, 6)):
    report(f"gluon BN{bn} stages{st}", lambda bn=bn, st=st: g.dsv4(q, k, out, BLOCK_N=bn, STAGES=st))
report("triton (committed) again", lambda: attention(q, k, k, out=out))
open(os.path.join(os.environ.get("OUT", "/tmp"), "gluon.txt"), "w").write("\n".join(lines) + "\n")
