"""The additive part of a map: what both operands explain alone, f(op1) + g(op2), with
the prompt's token layout (``AdditiveOperands``, an exact least-squares projection), and
every window of an operator's values less that fit (``WindowScan``), for
``catalog.labels.operand_fit``'s rule. docs/method.md section 7 ("What a label explains")."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from catalog.core.arith import apply_op
from catalog.labels.fit_models import Design, levels
from catalog.labels.tails import digit_count

# neurons per block of the projections (a block of float64 maps on a [0, 300) grid is
# block x 90,000 x 8 bytes)
BLOCK = 256


def other_result(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Operator ``op``'s result on cells that may not be valid for it (``apply_op``; a
    division by zero is a value of its own, -1)."""
    out = apply_op(op, a, b)
    return np.where(np.asarray(b) > 0, out, -1) if op == "/" else out


def layout(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each cell's token layout: the digit counts of op1 and op2 together (how the prompt
    is written: on a digit-level tokenizer, its token count and positions)."""
    return digit_count(np.abs(np.asarray(a))) * 100 + digit_count(np.abs(np.asarray(b)))


def operand_groups(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """The nuisance the rule keeps: op1's value, op2's value and the prompt's layout
    (their digit counts together: "both operands have two digits" is a fact of the
    format, not of the result)."""
    return [np.unique(x, return_inverse=True)[1].reshape(-1)
            for x in (np.asarray(a), np.asarray(b), layout(a, b))]


@dataclass
class AdditiveOperands:
    """f(op1) + g(op2) + h(layout) fit to maps on one operator's cells, exactly (normal
    equations with the pseudo-inverse of X'X, X the one-hot designs side by side): both
    operands' main effects and the prompt's token layout (``operand_groups``)."""

    design: Design
    pinv: torch.Tensor  # (width, width) float64
    n_operands: int  # every column (op1's values, op2's, the layouts)
    rank: int  # dimension of the space (constant included)

    @classmethod
    def of(cls, a: np.ndarray, b: np.ndarray, device: str | torch.device = "cpu"
           ) -> AdditiveOperands:
        groups = operand_groups(a, b)
        design = Design(groups, device)
        n_op = design.width
        rank = int(np.linalg.matrix_rank(design.xtx, hermitian=True))
        pinv = np.linalg.pinv(design.xtx, hermitian=True)
        return cls(design, torch.as_tensor(pinv, device=device), n_op, rank)

    def fitted(self, maps: torch.Tensor) -> torch.Tensor:
        """(n, cells) float64: each map's least-squares f(op1) + g(op2)."""
        y = maps.double()
        c = self.design.sums(y) @ self.pinv.to(y.device)
        return self.design.on_cells(c, self.n_operands)


# the windows of an operator's values that compete for a map: every run of consecutive
# bins of at most this many bins of its distinct values (by rank)
SCAN_BINS = 64


@dataclass
class WindowScan:
    """Every window of one operator's values (runs of ``SCAN_BINS`` bins) as a cell set
    less the additive fit, through cumulative sums: with C the cumulative residual bin
    indicators (C_0 = 0), window [i, j) explains (D_j - D_i)^2 / (G_jj + G_ii - 2 G_ij)
    of a map's residual r_y beyond the operands, D = r_y C', G = C C'. Cells where the
    operator's result is undefined (negative, division by zero) are in no window.
    ``first``/``last``/``den``: the windows [i, j) with i < j that hold a cell set of
    their own (den > 0), and their denominators."""

    c: torch.Tensor  # (bins + 1, cells) float64
    g: torch.Tensor  # (bins + 1, bins + 1)
    first: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    last: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    den: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))

    @classmethod
    def of(cls, values: np.ndarray, add: AdditiveOperands, device) -> WindowScan:
        values = np.asarray(values)
        valid = np.nonzero(values >= 0)[0]
        lev = levels(values[valid], SCAN_BINS)
        ind = torch.zeros(int(lev.max()) + 1 if len(lev) else 0, len(values),
                          dtype=torch.float64, device=device)
        ind[torch.as_tensor(lev, device=device), torch.as_tensor(valid, device=device)] = 1
        r = ind - add.fitted(ind)
        c = torch.cat([torch.zeros(1, len(values), dtype=torch.float64, device=device),
                       torch.cumsum(r, 0)])
        g = c @ c.T
        diag = torch.diagonal(g)
        den = diag[None, :] + diag[:, None] - 2 * g  # [i, j]
        i, j = torch.nonzero(torch.triu(den > 1e-12, diagonal=1), as_tuple=True)
        return cls(c, g, i, j, den[i, j])

    def best(self, r_y: torch.Tensor) -> torch.Tensor:
        """(n,) the largest sum of squares one window explains of each residual map."""
        if not len(self.den):
            return torch.zeros(len(r_y), dtype=r_y.dtype, device=r_y.device)
        d = r_y @ self.c.T
        num = (d.index_select(1, self.last) - d.index_select(1, self.first)) ** 2
        return (num / self.den).amax(1).clamp(min=0)
