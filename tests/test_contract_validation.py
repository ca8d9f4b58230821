"""Bad input is refused before any kernel code runs, with a message that names the argument,
what was expected and what came in. Checked through a real kernel entry point."""

import re

import numpy as np
import pytest
import torch

import fmha
from fmha import ContractError, NotSupportedError, check_attention_args, check_merge_args
from fmha.contract import Capabilities
from fmha.registry import KERNELS

sdpa_math = KERNELS["sdpa-math"]


def _qkv(B=1, T=4, S=8, Hq=4, Hkv=2, D=64, Dv=None, dtype=torch.bfloat16):
    q = torch.randn(B, T, Hq, D, dtype=dtype)
    k = torch.randn(B, S, Hkv, D, dtype=dtype)
    v = torch.randn(B, S, Hkv, Dv or D, dtype=dtype)
    return q, k, v


def _refused(match, q, k, v, **kw):
    with pytest.raises(ContractError, match=re.escape(match)):
        sdpa_math(q, k, v, **kw)


def test_rank():
    q, k, v = _qkv()
    _refused("q: expected rank 4 (B, T, Hq, D), got rank 3", q[0], k, v)


def test_batch_mismatch():
    q, _, _ = _qkv(B=2)
    _, k, v = _qkv(B=3)
    _refused("k, v: expected batch B=2 (q's), got k 3 and v 3", q, k, v)


def test_kv_length_mismatch():
    q, k, v = _qkv()
    _refused("v: expected S=8 keys (k's dim 1), got 7", q, k, v[:, :7])


def test_head_dim_mismatch():
    q, k, v = _qkv()
    _refused("k: expected head dim D=64 (q's dim 3), got 32", q, k[..., :32].contiguous(), v)


def test_kv_heads_mismatch():
    q, k, v = _qkv()
    _refused("v: expected Hkv=2 heads (k's dim 2), got 1", q, k, v[:, :, :1])


def test_query_heads_not_a_multiple_of_kv_heads():
    q, k, v = _qkv(Hq=3, Hkv=2)
    _refused("q, k: expected Hq % Hkv == 0, got Hq=3, Hkv=2", q, k, v)


def test_dtype_mismatch():
    q, k, v = _qkv()
    _refused("k, v: expected q's dtype torch.bfloat16, got k torch.float16 and v torch.bfloat16", q, k.half(), v)


def test_unsupported_dtype():
    q, k, v = _qkv()
    _refused("q: expected dtype bf16, fp16 or fp32, got torch.float64", q.double(), k, v)


def test_device_mismatch():
    q, k, v = _qkv()
    _refused("k, v: expected q's device cpu, got k on meta and v on cpu", q, k.to("meta"), v)


def test_non_contiguous_last_dim():
    q, k, v = _qkv()
    strided = torch.randn(1, 4, 4, 128, dtype=q.dtype)[..., ::2]
    _refused("q: expected a contiguous last dim (stride 1), got strides (2048, 512, 128, 2)", strided, k, v)


@pytest.mark.parametrize("window", [0, -3])
def test_window_below_one(window):
    _refused(f"window: expected an int >= 1 or None, got {window}", *_qkv(), window=window)


def test_window_not_an_int():
    _refused("window: expected an int >= 1 or None, got float 2.5", *_qkv(), window=2.5)


def test_sink_shape():
    _refused("sink: expected shape (4,) (one logit per query head), got (2,)", *_qkv(), sink=torch.zeros(2))


def test_sink_dtype():
    _refused("sink: expected dtype float32, got torch.bfloat16", *_qkv(), sink=torch.zeros(4, dtype=torch.bfloat16))


def test_sink_device():
    _refused("sink: expected q's device cpu, got meta", *_qkv(), sink=torch.zeros(4, device="meta"))


def test_out_shape():
    q, k, v = _qkv(Dv=32)
    with pytest.raises(ContractError, match=re.escape("out: expected shape (1, 4, 4, 32) (B, T, Hq, Dv), got (1, 4, 4, 64)")):
        check_attention_args(q, k, v, out=torch.empty(1, 4, 4, 64, dtype=q.dtype))


def test_out_dtype():
    q, k, v = _qkv()
    with pytest.raises(ContractError, match=re.escape("out: expected q's dtype torch.bfloat16, got torch.float32")):
        check_attention_args(q, k, v, out=torch.empty(1, 4, 4, 64))


def test_out_on_a_kernel_without_out_support():
    q, k, v = _qkv()
    with pytest.raises(NotSupportedError, match=re.escape("no out support (the adapter does not take out=)")):
        sdpa_math(q, k, v, out=torch.empty_like(q))


def test_unsupported_head_dim_for_a_kernel():
    q, k, v = _qkv(D=96)
    caps = Capabilities(head_dims=(64, 128, 256, 512), notes={"head_dim": "tiles are powers of two"})
    with pytest.raises(NotSupportedError, match=re.escape("head dim D=96 unsupported (supports [64, 128, 256, 512]) (tiles are powers of two)")):
        check_attention_args(q, k, v, capabilities=caps)


def test_unsupported_feature_names_the_reason():
    with pytest.raises(NotSupportedError, match=re.escape("no sink support (SDPA has no sink term")):
        sdpa_math(*_qkv(), sink=torch.zeros(4))


def test_merge_lse_shape_and_dtype():
    o = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ContractError, match=re.escape("parts[1].lse: expected shape (1, 2, 4) (B, H, T), got shape (1, 4, 2)")):
        check_merge_args([(o, torch.zeros(1, 2, 4)), (o, torch.zeros(1, 4, 2))])
    with pytest.raises(ContractError, match=re.escape("parts[0].lse: expected float32 on cpu, got torch.float64 on cpu")):
        check_merge_args([(o, torch.zeros(1, 2, 4, dtype=torch.float64))])


def test_merge_sink_shape():
    o = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ContractError, match=re.escape("sink: expected a float32 tensor of shape (2,), got (3,)")):
        check_merge_args([(o, torch.zeros(1, 2, 4))], sink=torch.zeros(3))


@pytest.mark.parametrize("scale, shown", [(float("inf"), "inf"), (float("nan"), "nan"), (0.0, "0.0"), (-0.5, "-0.5")])
def test_scale_must_be_positive_and_finite(scale, shown):
    _refused(f"scale: expected a positive finite float or None, got {shown}", *_qkv(), scale=scale)


def test_scale_of_the_wrong_type_names_the_type():
    _refused("scale: expected a positive finite float or None, got str '0.1'", *_qkv(), scale="0.1")


@pytest.mark.parametrize("bad, shown", [(float("nan"), "nan"), (float("inf"), "inf")])
def test_sink_nan_or_plus_infinity_is_refused_with_the_head(bad, shown):
    sink = torch.zeros(4)
    sink[2] = bad
    _refused(f"sink: expected finite logits, or -inf for no sink, got {shown} at head 2 (1 of 4 values", *_qkv(),
             sink=sink)


def test_sink_minus_infinity_is_no_sink_and_accepted():
    check_attention_args(*_qkv(), sink=torch.full((4,), float("-inf")))


def test_merge_lse_plus_infinity_is_refused_with_its_place():
    o = torch.zeros(1, 4, 2, 8)
    lse = torch.zeros(1, 2, 4)
    lse[0, 1, 3] = float("inf")
    with pytest.raises(ContractError, match=re.escape(
            "parts[1].lse: expected finite values, or -inf for an empty part, got inf at (b, h, t) (0, 1, 3)")):
        check_merge_args([(o, torch.zeros(1, 2, 4)), (o, lse)])


def test_numpy_scalars_are_accepted_where_python_numbers_are():
    q, k, v = _qkv()
    expected, _ = sdpa_math(q, k, v, scale=0.25, causal=True, window=3)
    o, _ = sdpa_math(q, k, v, scale=np.float32(0.25), causal=np.bool_(True), window=np.int64(3))
    assert torch.equal(o, expected)
    problem = check_attention_args(q, k, v, scale=np.float64(0.25), causal=np.bool_(False), window=np.int32(3))
    assert problem.window == 3 and type(problem.window) is int and problem.causal is True


def test_a_type_error_names_the_type_without_repeating_itself():
    with pytest.raises(ContractError) as caught:
        sdpa_math(*_qkv(), causal=np.int64(1))
    assert str(caught.value) == "causal: expected True or False, got numpy.int64 np.int64(1)"


def test_unsupported_head_dims_give_one_reason_with_the_note_once():
    q, k, v = _qkv(D=96, Dv=600)
    caps = Capabilities(head_dims=(64, 128), notes={"head_dim": "tiles are powers of two"})
    with pytest.raises(NotSupportedError) as caught:
        check_attention_args(q, k, v, capabilities=caps)
    assert str(caught.value) == "head dim D=96, Dv=600 unsupported (supports [64, 128]) (tiles are powers of two)"


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_inputs_that_require_grad_get_a_forward_only_error(name):
    tensors = dict(zip("qkv", _qkv()))
    tensors[name].requires_grad_(True)
    _refused(f"{name}: requires grad, but the attention contract is forward-only", *tensors.values())
    with torch.no_grad():
        o, _ = sdpa_math(*tensors.values())  # under no_grad the same call is fine
    assert o.shape == (1, 4, 4, 64)


def test_fmha_attention_validates_before_any_kernel_runs():
    q, k, v = _qkv()
    with pytest.raises(ContractError, match=re.escape("scale: expected a positive finite float or None, got nan")):
        fmha.attention(q, k, v, scale=float("nan"))
    with pytest.raises(ContractError, match=re.escape("sink: expected finite logits")):
        fmha.attention(q, k, v, sink=torch.tensor([0.0, float("nan"), 0.0, 0.0]))


def test_an_sdpa_backend_that_has_no_kernel_for_a_call_refuses_it_with_pytorchs_reasons(monkeypatch):
    """cuDNN SDPA raises "No available kernel" for one key (an H200, torch 2.11): the adapter
    turns that into NotSupportedError (a skip) carrying the warning PyTorch gave."""
    import warnings

    from fmha.adapters import sdpa

    def no_kernel(*args, **kwargs):
        warnings.warn("cudnn SDPA does not support key/value sequence length 1. (Triggered internally at x.cpp:555.)")
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", no_kernel)
    with pytest.raises(NotSupportedError, match=r"^sdpa-math: PyTorch has no kernel for this call: "
                                                r"cudnn SDPA does not support key/value sequence length 1\.$"):
        sdpa_math(*_qkv())
