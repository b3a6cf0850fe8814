"""The random choices of one sample: dtype, shapes, tensors, constants, dims, bounds, op keys.

Shapes are drawn first and correlated (a base shape per sample, sizes from a
small pool) so that the shape conditions rules test (``(= (shape a) (shape
b))``, operands that broadcast, lists that concatenate) often hold; dims,
slice bounds, reshape targets and permutations are then drawn within the
shapes they apply to.
"""

from __future__ import annotations

import math
import random
from typing import cast

import torch

from optimus_eqsat.rule_check.meaning import SAMPLE_OPS, TV, ListVal

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_DTYPES = (*FLOAT_DTYPES, torch.int64, torch.int32)
_DTYPE_WEIGHTS = (0.3, 0.15, 0.15, 0.15, 0.15, 0.1)
_RANK_WEIGHTS = (0.05, 0.22, 0.3, 0.23, 0.12, 0.08)  # ranks 0-5 (generated rules go to rank 5)
# Scalar constants: 0, 1, -1, the usual small ones, and large and small magnitudes.
_CONSTANTS = (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, 0.25, 10.0, -7.0, 1e3, -1e3, 1e-3, 1e6, 1e-6, 1e20, -1e-20)
_INTEGRAL_CONSTANTS = (0.0, 1.0, -1.0, 2.0, -2.0, 3.0, 5.0, -7.0, 100.0)


class SampleSpace:
    """One sample's random source, dtype, pool of sizes and base shape."""

    def __init__(self, rng: random.Random, mixed_dtypes: bool = True):
        self.rng = rng
        self.gen = torch.Generator().manual_seed(rng.getrandbits(62))
        self.dtype = rng.choices(_DTYPES, _DTYPE_WEIGHTS)[0]
        # in some samples, tensors of several float dtypes (type promotion)
        self.mixed = rng.random() < 0.1 and mixed_dtypes
        self.sizes = rng.sample(range(1, 6), rng.choice((2, 3)))
        if max(self.sizes) == 1:
            self.sizes.append(rng.randint(2, 5))
        self.base = self.random_shape()
        self.unit = rng.choice((1, 1, 2))  # slice bounds on this grid often: runs of equal pieces
        self.dtypes_drawn: set[torch.dtype] = set()

    # ---------------------------------------------------------------- shapes
    def size(self) -> int:
        return self.rng.choice(self.sizes)

    def random_shape(self, min_rank: int = 0) -> tuple[int, ...]:
        rank = self.rng.choices(range(len(_RANK_WEIGHTS)), _RANK_WEIGHTS)[0]
        return tuple(self.size() for _ in range(max(rank, min_rank)))

    def variant(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts against ``shape``: a suffix of it, or some dims 1."""
        if shape and self.rng.random() < 0.5:
            return shape[self.rng.randint(1, len(shape)) :]
        return tuple(1 if self.rng.random() < 0.4 else s for s in shape)

    def shape(self) -> tuple[int, ...]:
        roll = self.rng.random()
        if roll < 0.5:
            return self.base
        return self.variant(self.base) if roll < 0.7 else self.random_shape()

    def broadcast_like(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        roll = self.rng.random()
        return shape if roll < 0.6 else self.variant(shape) if roll < 0.85 else self.random_shape()

    def reshape_target(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape with as many elements (its own shape sometimes)."""
        if self.rng.random() < 0.15:
            return shape
        n = math.prod(shape)
        rank = self.rng.choice((1, 2, 2, 3, 3, 4))
        if n == 0:
            out = [self.size() for _ in range(rank)]
            out[self.rng.randrange(rank)] = 0
            return tuple(out)
        dims = [1] * rank
        for p in _prime_factors(n):
            dims[self.rng.randrange(rank)] *= p
        return tuple(dims)

    def permutation(self, rank: int) -> tuple[int, ...]:
        perm = list(range(rank))
        roll = self.rng.random()
        if roll < 0.15 or rank < 2:
            return tuple(perm)
        if roll < 0.45:
            i, j = self.rng.sample(range(rank), 2)
            perm[i], perm[j] = perm[j], perm[i]
        else:
            self.rng.shuffle(perm)
        return tuple(perm)

    def expand_target(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.rng.random() < 0.15:
            return shape
        out = tuple(self.size() if s == 1 and self.rng.random() < 0.7 else s for s in shape)
        return (self.size(), *out) if self.rng.random() < 0.3 else out

    def dim_of(self, shape: tuple[int, ...]) -> int:
        return self.rng.randrange(len(shape)) if shape else 0

    def bounds(self, n: int, start: int | None = None, end: int | None = None) -> tuple[int, int]:
        """Slice bounds 0 <= start <= end <= n (given ones kept); empty pieces now and then;
        often pieces of one or two units (adjacent pieces of equal widths are what cat runs merge)."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.08 or n == 0:  # an empty piece
            k = rng.randint(0, n) if start is None and end is None else start if end is None else end
            return k, k  # type: ignore[return-value]
        if roll < 0.6:
            width = self.unit * rng.choice((1, 1, 2))
            if start is None and end is None:
                start = self.unit * rng.randint(0, (n - 1) // self.unit)
            if start is None:
                end = cast(int, end)  # given, since start is not
                return max(end - width, 0), end
            return start, min(start + width, max(n, start))
        if start is None and end is None:
            start = rng.randint(0, n - 1)
            return start, rng.randint(start + 1, n)
        if start is None:
            end = cast(int, end)  # given, since start is not
            return rng.randint(0, max(end, 0)), end
        return start, rng.randint(start, max(start, n))

    # ---------------------------------------------------------------- values
    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> TV:
        rng = self.rng
        if dtype is None:
            dtype = rng.choice(FLOAT_DTYPES) if self.mixed and rng.random() < 0.5 else self.dtype
        self.dtypes_drawn.add(dtype)
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=self.gen, dtype=torch.float64)
            t = t * rng.choice((1.0, 1.0, 1.0, 100.0, 0.01))
            if rng.random() < 0.25:  # exact zeros, as relu outputs have
                t = t * (torch.rand(shape, generator=self.gen, dtype=torch.float64) > 0.3)
            if rng.random() < 0.15:  # whole numbers: ties for maximum/minimum, exact sums
                t = t.round()
            t = t.to(dtype)
        else:
            t = torch.randint(-4, 5, shape, generator=self.gen).to(dtype)
        return TV.of(t)

    def list_like(self, head: TV | None) -> ListVal:
        """A list whose members concatenate with ``head`` (or with each other)."""
        rng = self.rng
        if head is None:
            shape = self.shape() or (self.size(),)
            dim, count, dtype = self.dim_of(shape), rng.choice((1, 2, 3)), None
        else:
            shape = tuple(head.value.shape)
            if not shape:
                return ListVal((), 0)
            dim, count, dtype = self.dim_of(shape), rng.choice((0, 0, 1, 1, 2)), head.value.dtype
        items = []
        for _ in range(count):
            member = list(shape)
            member[dim] = self.size()
            items.append(self.tensor(tuple(member), dtype))
        return ListVal(tuple(items), dim)

    def constant(self, integral: bool = False) -> float:
        rng = self.rng
        if integral and rng.random() < 0.8:
            return rng.choice(_INTEGRAL_CONSTANTS)
        if rng.random() < 0.7:
            return rng.choice(_CONSTANTS)
        return round(rng.uniform(-5, 5), 3)

    def op_key(self, ctor: str) -> str:
        return self.rng.choice(list(SAMPLE_OPS.get(ctor, SAMPLE_OPS["Unary"])))

    def leaf_index(self) -> int:
        return self.rng.randint(0, 2)

    def small_int(self) -> int:
        return self.rng.randint(0, 4)


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])
