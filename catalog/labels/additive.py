"""The additive part of a map: what both operands explain alone, f(op1) + g(op2), with
the prompt's token layout (``AdditiveOperands``, an exact least-squares projection), and
every window of an operator's values less that fit (``WindowScan``), and what one set explains
of a map beyond that fit (``partial_tests``, ``partial_p``, ``explained``), for
``catalog.labels.operand_fit``'s rule. docs/method.md section 7 ("What a label explains")."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from catalog.core.arith import apply_op
from catalog.labels.fit_models import Design, levels
from catalog.labels.tails import digit_count

# neurons per block of the projections (a block of float64 maps on a [0, 300) grid is
# block x 90,000 x 8 bytes; on Qwen's [0, 30) grid blocks of 1,024 to 4,864 maps ran the
# rule's steps up to a third slower than 256)
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
    operands' main effects and the prompt's token layout (``operand_groups``).

    On a complete grid in row-major order (every op1 value with every op2 value once, op2
    running fastest: ``+`` and ``*`` on [0, n)) the same projection is taken without the
    design: the two-way analysis of variance (each map less its row and column means plus
    its grand mean) is the exact projection on the operands' main effects there, and the
    layout adds what its classes hold beyond them, an orthonormal basis ``inter`` (cells x
    k; k = 1 for one- and two-digit operands) of its residual indicators. That is a few
    passes over each map in place of two products with the design (3x faster on Qwen's
    [0, 30) grid, 512 maps: 0.9 ms against 2.8), equal to the design's fit to rounding."""

    design: Design
    pinv: torch.Tensor  # (width, width) float64
    n_operands: int  # every column (op1's values, op2's, the layouts)
    rank: int  # dimension of the space (constant included)
    grid: tuple[int, int] | None = None  # (op1 values, op2 values) of a complete grid
    inter: torch.Tensor | None = None  # (cells, k) the layout beyond the operands

    @classmethod
    def of(cls, a: np.ndarray, b: np.ndarray, device: str | torch.device = "cpu"
           ) -> AdditiveOperands:
        groups = operand_groups(a, b)
        design = Design(groups, device)
        n_op = design.width
        rank = int(np.linalg.matrix_rank(design.xtx, hermitian=True))
        pinv = np.linalg.pinv(design.xtx, hermitian=True)
        out = cls(design, torch.as_tensor(pinv, device=device), n_op, rank)
        grid = _row_major_grid(np.asarray(a), np.asarray(b))
        if grid is not None:
            out.grid = grid
            lay = torch.as_tensor(np.eye(int(groups[2].max()) + 1)[groups[2]].T,
                                  dtype=torch.float64, device=device)
            q, r = torch.linalg.qr(out._anova(lay).T)
            d = r.diagonal().abs()
            out.inter = q[:, d > 1e-9 * max(float(d.max()), 1e-300)].contiguous()
        return out

    def _anova(self, y: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """(n, cells) each map less its row and column means plus its grand mean (with
        ``inplace``, in ``y``: the same operations in the same order)."""
        assert self.grid is not None
        n, (rows, cols) = len(y), self.grid
        g = y.view(n, rows, cols)
        row_mean, col_mean = g.mean(2, keepdim=True), g.mean(1, keepdim=True)
        if inplace:
            return g.sub_(row_mean).sub_(col_mean).add_(row_mean.mean(1, keepdim=True)).view(n, -1)
        return (g - row_mean - col_mean + row_mean.mean(1, keepdim=True)).view(n, -1)

    def residual(self, maps: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """(n, cells) float64: each map less its least-squares f(op1) + g(op2) + h(layout);
        with ``out`` (float64, contiguous, the maps' shape), written there (on a complete
        grid without a temporary: ``OperandFit.hold`` takes every map's once)."""
        if self.grid is None:
            y = maps.double()
            e = y - self.fitted(y)
            return e if out is None else out.copy_(e)
        assert self.inter is not None
        if out is None:
            e = self._anova(maps.double())
            return e.addmm_(e @ self.inter, self.inter.T, alpha=-1)
        e = self._anova(out.copy_(maps), inplace=True)  # a view of ``out``
        e.addmm_(e @ self.inter, self.inter.T, alpha=-1)
        return out

    def fitted(self, maps: torch.Tensor) -> torch.Tensor:
        """(n, cells) float64: each map's least-squares f(op1) + g(op2) + h(layout)."""
        y = maps.double()
        if self.grid is not None:
            return y - self.residual(y)
        c = self.design.sums(y) @ self.pinv.to(y.device)
        return self.design.on_cells(c, self.n_operands)


def _row_major_grid(a: np.ndarray, b: np.ndarray) -> tuple[int, int] | None:
    """(op1 values, op2 values) where the cells are every pair of them once, op1 by op1
    with op2 running fastest; else None."""
    ua, ub = np.unique(a), np.unique(b)
    n = len(ua) * len(ub)
    if len(a) != n or n == 0:
        return None
    i = np.arange(n)
    if not (np.array_equal(a, ua[i // len(ub)]) and np.array_equal(b, ub[i % len(ub)])):
        return None
    return len(ua), len(ub)


# the windows of an operator's values that compete for a map: every run of consecutive
# bins of at most this many bins of its distinct values (by rank)
SCAN_BINS = 64
# twice the bound on a window's root taken in float32, relative to max|D| max|pick|
# (``WindowScan.bounds``)
SCAN_SLACK = 32 * 2.0 ** -24


@dataclass
class WindowScan:
    """Every window of one operator's values (runs of ``SCAN_BINS`` bins) as a cell set
    less the additive fit, through cumulative sums: with C the cumulative residual bin
    indicators (C_0 = 0), window [i, j) explains (D_j - D_i)^2 / (G_jj + G_ii - 2 G_ij)
    of a map's residual r_y beyond the operands, D = r_y C', G = C C'. Cells where the
    operator's result is undefined (negative, division by zero) are in no window.
    ``first``/``last``/``den``: the windows [i, j) with i < j that hold a cell set of
    their own (den > 0), and their denominators; ``pick``: (bins + 1, windows), column k
    +1/sqrt(den_k) at row last_k and -1/sqrt(den_k) at row first_k, so that D pick holds
    each window's signed root (one product in place of two gathers, a difference, a
    square and a division over every window of every map). A residual map is orthogonal
    to every additive map, so D_k = r_y . C_k is the sum of r_y over the cells of the
    bins below k (``sums``): one scatter of the cells per map in place of a product with
    C (2-2.5x faster on Qwen's [0, 30) grid, 256 maps; equal to float64's rounding).
    C and G are not kept: C is (bins + 1) x cells float64, 47 MB a scan on [0, 300)
    (four scans a fit, eight fits a run of + - * /), and ``sums`` needs only each cell's
    bin."""

    # bins + 1: the rows of C (C_0 = 0 and one per bin), the columns of ``sums``
    rows: int
    first: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    last: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    den: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    pick: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.float64))
    # ``pick`` in float32 and its largest entry (``bounds``)
    pick32: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0))
    pick_max: float = 0.0
    # each cell's bin, 1 + the bin's index (0: in no window), for ``sums``
    bin_of: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    @classmethod
    def of(cls, values: np.ndarray, add: AdditiveOperands, device) -> WindowScan:
        values = np.asarray(values)
        valid = np.nonzero(values >= 0)[0]
        lev = levels(values[valid], SCAN_BINS)
        ind = torch.zeros(int(lev.max()) + 1 if len(lev) else 0, len(values),
                          dtype=torch.float64, device=device)
        ind[torch.as_tensor(lev, device=device), torch.as_tensor(valid, device=device)] = 1
        bin_of = torch.zeros(len(values), dtype=torch.long, device=device)
        bin_of[torch.as_tensor(valid, device=device)] = torch.as_tensor(lev, device=device) + 1
        r = add.residual(ind)
        c = torch.cat([torch.zeros(1, len(values), dtype=torch.float64, device=device),
                       torch.cumsum(r, 0)])
        g = c @ c.T
        diag = torch.diagonal(g)
        den = diag[None, :] + diag[:, None] - 2 * g  # [i, j]
        i, j = torch.nonzero(torch.triu(den > 1e-12, diagonal=1), as_tuple=True)
        d_ij = den[i, j]
        pick = torch.zeros(len(c), len(d_ij), dtype=torch.float64, device=device)
        k = torch.arange(len(d_ij), device=device)
        pick[j, k] = 1 / torch.sqrt(d_ij)
        pick[i, k] = -1 / torch.sqrt(d_ij)
        return cls(len(c), i, j, d_ij, pick, pick.float(),
                   float(pick.abs().max()) if pick.numel() else 0.0, bin_of)

    def sums(self, r_y: torch.Tensor) -> torch.Tensor:
        """(n, bins + 1) D = r_y C' of residual maps ``r_y`` (float64): D_0 = 0 and D_k the
        sum of r_y over the cells of bins 0 .. k - 1."""
        per_bin = torch.zeros(len(r_y), self.rows, dtype=torch.float64, device=r_y.device)
        per_bin.index_add_(1, self.bin_of, r_y.double())
        per_bin[:, 0] = 0  # the cells in no window
        return per_bin.cumsum_(1)

    def best(self, r_y: torch.Tensor) -> torch.Tensor:
        """(n,) the largest sum of squares one window explains of each residual map."""
        if not len(self.den):
            return torch.zeros(len(r_y), dtype=r_y.dtype, device=r_y.device)
        # the largest root in absolute value, squared (torch.aminmax over rows ran 10-20x
        # slower than abs and amax on this project's CPUs: 0.5 ms against 0.04 for 256
        # maps of 1,769 windows)
        top = (self.sums(r_y) @ self.pick).abs_().amax(1)
        return top * top

    def bounds(self, r_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(lo, hi), (n,) float64: bounds on ``best(r_y)`` from the windows' roots taken in
        float32 (about twice float64's rate, over every window of every map). Each root
        is (D_j - D_i) / sqrt(den) from two nonzero entries of ``pick`` (the others are
        exact zeros, which add nothing in any order of summation); rounding D and
        ``pick`` to float32, the two products and their sum each err by at most
        u = 2^-24 of their size, so a root errs by at most 8 u (|D_i| + |D_j|) max|pick|
        <= 16 u max|D| max|pick| (``SCAN_SLACK`` doubles it), and so does the largest
        root in absolute value (float64's own rounding is far inside that). A caller
        decides with the bounds where they settle its comparison, and takes ``best``
        of the maps where they do not."""
        n = len(r_y)
        if not len(self.den):
            zero = torch.zeros(n, dtype=torch.float64, device=r_y.device)
            return zero, zero
        d = self.sums(r_y)
        root = (d.float() @ self.pick32).abs_().amax(1).double()  # not aminmax: see best
        err = SCAN_SLACK * d.abs().amax(1) * self.pick_max
        return (root - err).clamp(min=0) ** 2, (root + err) ** 2


def partial_p(r_y: torch.Tensor, r_s: torch.Tensor, ni: torch.Tensor, si: torch.Tensor,
               sign: np.ndarray | None, df: int) -> np.ndarray:
    """``partial_tests``' p-values."""
    return partial_tests(r_y, r_s, ni, si, sign, df)[0]


def partial_tests(r_y: torch.Tensor, r_s: torch.Tensor, ni: torch.Tensor, si: torch.Tensor,
                  sign: np.ndarray | None, df: int) -> tuple[np.ndarray, np.ndarray]:
    """One-sided p-value of each row (``ni``: its map among the residual maps ``r_y``;
    ``si``: its set among the residual sets ``r_s``, both less the operands' additive
    fit) for "the set explains the map beyond f(op1) + g(op2)": the partial regression of
    the map on the set's indicator with both operands' main effects in the model. Both
    the classic t-test (Student's t, ``df`` = N - rank - 1 degrees of freedom) and the
    heteroscedasticity-robust one (HC0, normal tail) are computed and the larger p-value
    is kept: maps whose spread differs from cell to cell (sparse activations) cannot pass
    on the classic test's variance alone. ``sign``: +1 where the set is scored at the
    map's top, -1 at its bottom; None: either direction (the K map of a result label,
    whose sign on the set depends on the sign of the lens). Every product is a matrix
    product over the rows' maps and sets (only the sets some row names: ``r_s`` may hold
    every set of the gate's rows). Also ``explained``'s value of each row, from the same
    products. The map's residual is read by two products, not three: its products with
    each set and with the set's cube side by side."""
    from scipy import special

    used, si = torch.unique(si, return_inverse=True)
    r_s = r_s.index_select(0, used)
    s2 = r_s * r_s
    y2 = r_y * r_y
    ss_y = y2.sum(1)
    k = len(r_s)
    both = r_y @ torch.cat([r_s, s2 * r_s]).T
    dot, ys3 = both[:, :k][ni, si], both[:, k:][ni, si]
    sss = s2.sum(1)[si]
    beta = dot / sss.clamp(min=1e-300)
    rss = (ss_y[ni] - dot * beta).clamp(min=0)
    t = dot / torch.sqrt(rss / df * sss).clamp(min=1e-300)
    # HC0: sum over cells of rs^2 e^2, e = ry - beta rs, expanded into the products
    y2s2 = (y2 @ s2.T)[ni, si]
    hc = (y2s2 - 2 * beta * ys3 + beta ** 2 * (s2 * s2).sum(1)[si]).clamp(min=0)
    z = dot / torch.sqrt(hc).clamp(min=1e-300)
    # the upper tails as scipy.stats computes them (t.sf(x, df) is stdtr(df, -x),
    # norm.sf(x) is ndtr(-x)), without the distribution objects' checks on every call
    if sign is None:
        p = np.maximum(2 * special.stdtr(df, -np.abs(t.cpu().numpy())),
                       2 * special.ndtr(-np.abs(z.cpu().numpy())))
    else:
        sg = torch.as_tensor(sign, dtype=torch.float64, device=r_y.device)
        p = np.maximum(special.stdtr(df, -(sg * t).cpu().numpy()),
                       special.ndtr(-(sg * z).cpu().numpy()))
    p[(sss <= 1e-12).cpu().numpy()] = 1.0  # the set is additive itself: nothing beyond
    return p, (dot ** 2 / sss.clamp(min=1e-300)).cpu().numpy()


def explained(r_y: torch.Tensor, r_s: torch.Tensor, ni: torch.Tensor,
               si: torch.Tensor) -> np.ndarray:
    """(r_y . r_s)^2 / |r_s|^2 of each row: what its set explains of its residual map."""
    dot = (r_y @ r_s.T)[ni, si]
    return (dot ** 2 / (r_s * r_s).sum(1)[si].clamp(min=1e-300)).cpu().numpy()


def with_set(r_y: torch.Tensor, r_s: torch.Tensor, ss: torch.Tensor,
             s: torch.Tensor) -> torch.Tensor:
    """Maps less the operands' part of their joint fit with a set, one set per map: y -
    A g where y ~ A g + beta s is fit by least squares (A: the additive design). With
    r_y and r_s the map's and the set's residuals beyond the additive fit (``ss``:
    |r_s|^2) and s the set itself, beta = r_y . r_s / |r_s|^2 and y - A g = r_y +
    beta (s - r_s): the residual with the set's own additive part put back at its
    fitted size. Taking the additive fit alone out of a band of the sum takes a ramp out
    of the band too (its top cells sink into the noise); this leaves the band whole."""
    beta = (r_y * r_s).sum(1) / ss.clamp(min=1e-300)
    return r_y + beta[:, None] * (s - r_s)


def screen_t_test(r: torch.Tensor, sets32: torch.Tensor, sets_ss: torch.Tensor, df: int,
                  t2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The second pass's screen of residual maps ``r`` (float64) against residual sets
    ``sets32`` (float32; ``sets_ss``: their float64 sums of squares): (at least what each
    set explains of each map, whether the classic test may pass). The test passes where
    dot^2 (df + t^2) >= t^2 |r|^2 |s|^2 (dot = r . s); here the products run in float32,
    |dot| raised and |r|^2 lowered by their largest error (``_float32_slack``), so that no
    pair the float64 test passes is screened out."""
    slack = _float32_slack(r.shape[1])
    r32 = r.float()
    rr = (r32 * r32).sum(1, keepdim=True).double()
    dot = (r32 @ sets32.T).double().abs()
    dot = dot + slack * torch.sqrt(rr * (1 + slack) * sets_ss)
    return dot * dot / sets_ss, dot * dot * (df + t2) >= t2 * rr * (1 - slack) * sets_ss


def _float32_slack(n_cells: int) -> float:
    """A bound on the relative error of float32 dot products and sums of squares over
    ``n_cells`` float64 values rounded to float32: |fl(r . s) - r . s| <= slack |r| |s|
    whatever the order of summation ((n + 2) u / (1 - (n + 2) u), u = 2^-24, doubled)."""
    nu = (n_cells + 2) * 2.0 ** -24
    return 2 * nu / max(1 - nu, 1e-3)
