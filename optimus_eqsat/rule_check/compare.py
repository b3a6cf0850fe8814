"""Comparing the two sides of a rule on one sample, and printing values for a counterexample.

Shapes and dtypes must be equal. Integer and bool tensors must be equal
exactly. Float tensors must agree on infinities (with sign) and be close
elsewhere: ``|l - r| <= atol + rtol |l| + 8 eps scale``, where ``scale`` is
the magnitude of what either side was computed from (see :mod:`.meaning`), so
reassociated arithmetic passes and a wrong result does not. Where the matched
side is NaN (an undefined result, e.g. ``a/c + b/c`` at ``c = 0``) the
rewritten side may be anything; a NaN it introduces is a difference.
"""

from __future__ import annotations

import torch

from optimus_eqsat.rule_check.meaning import TV, Invalid, ListVal, concat

# torch.testing's defaults per dtype: (rtol, atol)
_TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
}
_ROUNDINGS = 8.0  # rounding errors allowed, in units of eps * scale


def difference(lhs: object, rhs: object, eps: float = 0.0) -> str | None:
    """What differs between the matched side's value and the rewritten one's (None: they agree)."""
    if isinstance(lhs, ListVal) and isinstance(rhs, ListVal):
        if lhs.dim != rhs.dim:
            return f"lists on dims {lhs.dim} and {rhs.dim}"
        if not lhs.items or not rhs.items:
            return None if not lhs.items and not rhs.items else "one list is empty, the other is not"
        try:
            lhs, rhs = concat(lhs.items, lhs.dim), concat(rhs.items, rhs.dim)
        except Invalid as exc:
            return f"a list does not concatenate: {exc}"
    if isinstance(lhs, TV) and isinstance(rhs, TV):
        return _tensor_difference(lhs, rhs, eps)
    if isinstance(lhs, (TV, ListVal)) or isinstance(rhs, (TV, ListVal)):
        return f"{kind(lhs)} vs {kind(rhs)}"
    return None if lhs == rhs else f"{lhs!r} vs {rhs!r}"


def _tensor_difference(lhs: TV, rhs: TV, eps: float) -> str | None:
    a, b = lhs.value, rhs.value
    if a.shape != b.shape:
        return f"shapes differ: {list(a.shape)} vs {list(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtypes differ: {dtype_name(a.dtype)} vs {dtype_name(b.dtype)}"
    if not a.is_floating_point():
        bad = a != b
        return None if not bad.any() else _at(bad, a.double(), b.double())
    a, b = a.double(), b.double()
    rtol, atol = _TOLERANCES.get(lhs.value.dtype, (1e-5, 1e-8))
    eps = max(eps, torch.finfo(lhs.value.dtype).eps)
    tol = atol + rtol * a.abs() + _ROUNDINGS * eps * torch.maximum(lhs.scale, rhs.scale)
    defined = ~torch.isnan(a)
    finite = torch.isfinite(a) & torch.isfinite(b)
    bad = defined & torch.isnan(b)
    bad |= defined & ~finite & ~torch.isnan(b) & (a != b)
    bad |= finite & ((a - b).abs() > tol)
    return None if not bad.any() else _at(bad, a, b, tol)


def _at(bad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, tol: torch.Tensor | None = None) -> str:
    index = tuple(int(i) for i in bad.nonzero()[0])
    where = f" at {list(index)}" if index else ""
    within = "" if tol is None or not torch.isfinite(a[index]) else f" (tolerance {float(tol[index]):.3g})"
    return (
        f"values differ{where}: {_num(a[index])} vs {_num(b[index])}{within}; {int(bad.sum())} of {bad.numel()} differ"
    )


def _num(x: torch.Tensor) -> str:
    v = float(x)
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def kind(value: object) -> str:
    if isinstance(value, TV):
        return f"{dtype_name(value.value.dtype)}{list(value.value.shape)}"
    if isinstance(value, ListVal):
        return f"list on dim {value.dim} of [{', '.join(kind(i) for i in value.items)}]"
    return type(value).__name__


def describe(value: object, limit: int = 16) -> str:
    """A short printable value: small tensors in full, larger ones by their range."""
    if isinstance(value, TV):
        t = value.value
        if t.numel() <= limit:
            text = str(t.tolist() if t.dim() else t.item())
            return f"{kind(value)} {text}"
        finite = t.double()[torch.isfinite(t.double())]
        span = f" in [{float(finite.min()):.3g}, {float(finite.max()):.3g}]" if finite.numel() else ""
        return f"{kind(value)}{span}"
    if isinstance(value, ListVal):
        return f"list on dim {value.dim} of [{', '.join(describe(i, limit // 2) for i in value.items)}]"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return f"(vec-of {' '.join(map(str, value))})" if value else "(vec-empty)"
    return repr(value)
