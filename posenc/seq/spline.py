"""Spline-based Transformers (Chandran, Serifi, Gross, Baecher; ECCV 2024,
https://arxiv.org/abs/2504.02797): a sequence autoencoder without positional encoding.

An encoder reads the input tokens together with ``K`` learned *control tokens*; the encoder's
outputs at the control tokens become ``K`` control points ``c_1 .. c_K`` in latent space (``R^D``).
They define a spline trajectory ``s(t)``, ``t in [0, 1]``, which is sampled at as many points
as the output needs, ``t_i = i / (N - 1)``; a decoder (transformer blocks, no positional
encoding) maps the samples ``s(t_1) .. s(t_N)`` to the output sequence. Order reaches the
decoder only through the trajectory, so any ``N`` can be decoded (more points than trained, or
fewer), and editing one control point edits the trajectory, hence the output, near it.

Spline family: a **clamped uniform B-spline of degree p (cubic, p = 3, by default)**. The text we
could read of the paper (abstract, summaries, the patent's abstract) does not name the family,
so the choice is ours:

- B-splines have *local support*: control point ``c_j`` moves ``s(t)`` only on
  ``t in [u_j, u_{j+p+1})`` (at most ``p + 1`` of the ``K - p`` knot spans). That is what makes
  control-point editing local, the use the paper advertises. A Bezier curve of ``K`` points is
  global (every Bernstein polynomial is non-zero on all of ``(0, 1)``).
- Cubic B-splines are C2 (smooth latent trajectories); Catmull-Rom interpolates its points but is
  only C1, and needs two phantom end points.
- Clamped knots (``p + 1`` repeated knots at 0 and 1) make ``s(0) = c_1`` and ``s(1) = c_K``, so
  the first and last control points are the latent codes of the sequence's ends.
- The basis is a partition of unity (the trajectory stays in the control points' convex hull)
  and reproduces straight lines: control points on a line at the Greville abscissae
  ``xi_j = (u_{j+1} + ... + u_{j+p}) / p`` give ``s(t) = a + b t`` exactly.
- With ``K = p + 1`` the clamped B-spline *is* the degree-p Bezier curve, so Bezier is the special
  case ``num_control_points = degree + 1``.

Encoder order. Without any position signal and with bidirectional attention, an encoder is
permutation invariant in its inputs: it could not tell a curve from the same curve traversed
backwards. ``encoder_mask="causal"`` (the default) gives the encoder order the way NoPE
(Kazemnejad et al. 2023) does, through a causal mask alone: input token ``i`` attends to tokens
``<= i`` and the control tokens, placed after the inputs, see every input. No positional
encoding is added anywhere. The order reaches the control tokens from the second block on (in
the first they read the inputs as a set), so a causal encoder needs ``depth >= 2``.
``encoder_mask="full"`` is the purely bidirectional encoder. ``encoder_encoding`` (not the
paper's model) puts a posenc encoding in the encoder only, e.g. ALiBi; the decoder never has one.
On the synthetic curves of ``posenc bench spline`` that variant learns far faster than the causal
NoPE encoder, which still extrapolates best to longer inputs.
"""

from __future__ import annotations

from typing import Literal, Mapping

import torch
from torch import Tensor, nn

from ..common.block import TransformerEncoder
from ..common.checks import check_int
from ..common.encoding import Hook, PositionEncoding, attention_part
from ..common.masks import AttentionMask
from ..common.registry import ModelDims, build, get
from .latent_autoencoder import spread_positions

EncoderMask = Literal["causal", "full"]
ENCODER_MASKS = ("causal", "full")


def _check_degree(degree: object) -> int:
    if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
        raise ValueError(f"degree must be an int >= 1 (3 for a cubic B-spline); got {degree!r}")
    return degree


def _check_num_control(num_control: object, degree: int, what: str = "num_control") -> int:
    if not isinstance(num_control, int) or isinstance(num_control, bool) or num_control < degree + 1:
        raise ValueError(
            f"{what}: a degree-{degree} B-spline needs at least {degree + 1} control points; got {num_control!r}"
        )
    return num_control


def clamped_uniform_knots(num_control: int, degree: int = 3, *, dtype=torch.float64, device=None) -> Tensor:
    """Knot vector ``[K + p + 1]`` of a clamped uniform B-spline on ``[0, 1]``: ``p + 1`` zeros,
    the ``K - p - 1`` interior knots ``j / (K - p)``, ``p + 1`` ones."""
    degree = _check_degree(degree)
    num_control = _check_num_control(num_control, degree)
    spans = num_control - degree
    interior = torch.arange(1, spans, dtype=dtype, device=device) / spans
    zeros = torch.zeros(degree + 1, dtype=dtype, device=device)
    return torch.cat((zeros, interior, zeros + 1))


def greville_abscissae(num_control: int, degree: int = 3, *, dtype=torch.float64, device=None) -> Tensor:
    """``[K]``: ``xi_j = mean(u_{j+1} .. u_{j+p})``. Control points ``a + b * xi_j`` give the
    trajectory ``s(t) = a + b t`` (linear precision)."""
    knots = clamped_uniform_knots(num_control, degree, dtype=dtype, device=device)
    return knots[1:-1].unfold(0, degree, 1).mean(-1)


def _check_times(t: object, name: str = "t") -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a tensor of times in [0, 1]; got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor of times in [0, 1]; got dtype {t.dtype}")
    if t.numel() and not bool(((t >= 0) & (t <= 1)).all()):  # also catches NaN
        bad = t[~((t >= 0) & (t <= 1))]
        raise ValueError(f"{name} must lie in [0, 1]; got values such as {bad.flatten()[0].item()!r}")
    return t


def bspline_basis(t: Tensor, num_control: int, degree: int = 3) -> Tensor:
    """Clamped uniform B-spline basis functions ``B_j(t)`` (Cox-de Boor recursion).

    Args:
        t: ``[...]`` times in ``[0, 1]`` (floating point; differentiable).
        num_control: ``K >= degree + 1``.
        degree: ``p >= 1``.

    Returns:
        ``[..., K]``, non-negative, summing to 1 over the last axis. ``t = 1`` belongs to the
        last span (so ``B_K(1) = 1``).
    """
    degree = _check_degree(degree)
    num_control = _check_num_control(num_control, degree)
    t = _check_times(t)
    knots = clamped_uniform_knots(num_control, degree, dtype=t.dtype, device=t.device)
    tt = t.unsqueeze(-1)
    lo, hi = knots[:-1], knots[1:]
    # degree 0: half-open spans [u_i, u_{i+1}); the last non-empty span (index K - 1) is closed at 1
    upper = tt < hi
    upper[..., num_control - 1] = tt[..., 0] <= hi[num_control - 1]
    basis = ((tt >= lo) & upper).to(t.dtype)  # [..., K + p]

    def ratio(num: Tensor, den: Tensor) -> Tensor:  # 0/0 := 0 (repeated knots)
        safe = torch.where(den > 0, den, torch.ones_like(den))
        return torch.where(den > 0, num / safe, torch.zeros_like(num))

    for q in range(1, degree + 1):
        n = knots.numel() - 1 - q  # functions of degree q
        u_i, u_iq = knots[:n], knots[q:q + n]
        u_i1, u_iq1 = knots[1:n + 1], knots[q + 1:q + 1 + n]
        left = ratio(tt - u_i, u_iq - u_i)
        right = ratio(u_iq1 - tt, u_iq1 - u_i1)
        basis = left * basis[..., :n] + right * basis[..., 1:n + 1]
    return basis


def evaluate_spline(control_points: Tensor, t: Tensor, degree: int = 3) -> Tensor:
    """Points of the clamped uniform B-spline through ``control_points`` at times ``t``.

    ``s(t) = sum_j B_j(t) c_j`` over the ``p + 1`` basis functions non-zero at ``t``
    (:func:`local_bspline_basis`): a control point reaches only the samples inside its support, so
    a NaN or inf one stays local. Differentiable in both arguments.

    Args:
        control_points: ``[B, K, D]`` floating point, ``K >= degree + 1``.
        t: ``[N]`` (shared by the batch) or ``[B, N]`` times in ``[0, 1]``; any ``N``.
        degree: ``p`` (3: cubic).

    Returns:
        ``[B, N, D]``.
    """
    if not isinstance(control_points, Tensor):
        raise TypeError(f"control_points must be a tensor [batch, num_control, dim]; got {type(control_points).__name__}")
    if control_points.dim() != 3:
        raise ValueError(f"control_points must be [batch, num_control, dim]; got shape {tuple(control_points.shape)}")
    if not control_points.dtype.is_floating_point:
        raise TypeError(f"control_points must be floating point; got dtype {control_points.dtype}")
    degree = _check_degree(degree)
    b, k, _ = control_points.shape
    _check_num_control(k, degree, "control_points")
    t = _check_times(t)
    if t.dim() not in (1, 2) or (t.dim() == 2 and t.shape[0] != b):
        raise ValueError(f"t must be [num_points] or [batch={b}, num_points]; got shape {tuple(t.shape)}")
    dtype = torch.promote_types(t.dtype, control_points.dtype)
    weights, first = local_bspline_basis(t.to(dtype), k, degree)  # [..., N, p + 1], [..., N]
    index = first.unsqueeze(-1) + torch.arange(degree + 1, device=t.device)  # [..., N, p + 1]
    c = control_points.to(dtype)
    if t.dim() == 1:
        points = c[:, index]  # [B, N, p + 1, D]
    else:
        flat = index.reshape(b, -1, 1).expand(-1, -1, c.shape[-1])
        points = c.gather(1, flat).view(b, t.shape[1], degree + 1, c.shape[-1])
    w = weights.unsqueeze(-1)
    # a basis value of exactly 0 (at the closed end of a support) must not read its control point:
    # 0 * NaN is NaN, and a bad point would leak one sample past its span
    return torch.where(w > 0, w * points, torch.zeros((), dtype=dtype, device=t.device)).sum(-2)


def local_bspline_basis(t: Tensor, num_control: int, degree: int = 3) -> tuple[Tensor, Tensor]:
    """The ``p + 1`` B-spline basis functions that can be non-zero at each time, and the index of
    the first: ``B_{j0} .. B_{j0 + p}`` at ``t`` (de Boor's triangular recursion on the knot span
    ``[u_mu, u_{mu+1})`` holding ``t``, ``j0 = mu - p``; Piegl and Tiller, The NURBS Book, A2.2).

    Every other basis function is zero there (local support), so evaluating a spline costs
    ``O(p^2)`` per sample instead of ``O(K p)``, and a control point only ever meets the samples of
    its own span. Equal to the matching columns of :func:`bspline_basis`.

    Args:
        t: ``[...]`` times in ``[0, 1]`` (floating point; differentiable).

    Returns:
        ``(weights [..., p + 1], first [...] long)``; ``t = 1`` belongs to the last span.
    """
    degree = _check_degree(degree)
    num_control = _check_num_control(num_control, degree)
    t = _check_times(t)
    knots = clamped_uniform_knots(num_control, degree, dtype=t.dtype, device=t.device)
    # the span: u_mu <= t < u_{mu+1}, mu in [p, K - 1] (t = 1 closes the last one)
    mu = (torch.searchsorted(knots, t.detach().contiguous(), right=True) - 1).clamp(degree, num_control - 1)
    basis = [torch.ones_like(t)]
    left, right = [None], [None]
    for j in range(1, degree + 1):
        left.append(t - knots[mu + 1 - j])
        right.append(knots[mu + j] - t)
        saved = torch.zeros_like(t)
        new = []
        for r in range(j):
            # u_{mu+r+1} - u_{mu+1-j+r} > 0 inside a non-empty span
            temp = basis[r] / (right[r + 1] + left[j - r])
            new.append(saved + right[r + 1] * temp)
            saved = left[j - r] * temp
        new.append(saved)
        basis = new
    return torch.stack(basis, dim=-1), mu - degree


def uniform_times(length: int, *, dtype=torch.float32, device=None) -> Tensor:
    """``[length]`` evenly spaced times ``t_i = i / (length - 1)`` on ``[0, 1]`` (``[0.]`` for one point)."""
    _check_length(length, "length")
    return torch.linspace(0.0, 1.0, length, dtype=dtype, device=device)


def _check_length(length: object, name: str) -> int:
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ValueError(f"{name} must be an int >= 1 (the number of output points); got {length!r}")
    return length


def _build_encoding(
    name: str | None, options: Mapping[str, object] | None, dim: int, num_heads: int, max_len: int
) -> PositionEncoding | None:
    """A registered sequence encoding for bidirectional use (ALiBi symmetric), or None."""
    if name is None:
        if options:
            raise ValueError("encoding_options needs an encoding name; got encoder_encoding=None")
        return None
    try:
        get(name)
    except KeyError as exc:
        raise ValueError(f"encoder_encoding: {exc.args[0]}") from None
    options = dict(options or {})
    if name == "alibi":
        options.setdefault("symmetric", True)
    enc = build(name, dims=ModelDims(dim=dim, num_heads=num_heads, max_len=max_len), **options)
    if enc.causal_only:
        raise ValueError(f"encoder_encoding {name!r} is defined for causal attention only; the control tokens "
                         "attend to every input")
    return enc


class SplineTransformer(nn.Module):
    """Spline-based Transformer autoencoder (see the module docstring).

    Args:
        in_dim: features per sequence element (2 for planar curves).
        dim: model width ``D`` (also the latent space of the control points).
        depth: blocks in the encoder; ``decoder_depth`` defaults to it.
        num_heads: attention heads.
        num_control_points: ``K`` learned control tokens, ``K >= degree + 1``.
        degree: B-spline degree ``p`` (3: cubic).
        decoder_depth: blocks in the decoder (default ``depth``).
        mlp_ratio: of the blocks, like ``dropout``.
        encoder_mask: ``"causal"`` (input token ``i`` sees inputs ``<= i``; control tokens see
            everything) or ``"full"`` (bidirectional, permutation invariant in the inputs).
        decoder_window: None for full attention in the decoder, or a sliding window (tokens
            ``|i - j| < window``): then an edit of control point ``j`` changes only outputs within
            ``decoder_depth * (window - 1)`` samples of the trajectory's changed part.
        encoder_encoding: None (the paper's model: no positional encoding anywhere), or a
            registered sequence encoding for the *encoder only* (``"alibi"``, ``"rope"``, ...;
            ALiBi is built symmetric): the input tokens get positions ``0 .. L-1``, the control
            tokens evenly spread positions over them (as in
            :class:`~posenc.seq.PositionalAutoencoder`); an input encoding is added to the input
            tokens only. The decoder never has one.
        encoding_options: constructor arguments of ``encoder_encoding``.
        max_len: for encoder encodings with a table of positions.
        backend: attention kernel path of the blocks.

    Shapes: ``x [B, L, in_dim]`` -> ``encode`` -> ``[B, K, D]`` -> ``decode(., N)`` -> ``[B, N, in_dim]``.
    """

    def __init__(
        self,
        in_dim: int,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        *,
        num_control_points: int = 8,
        degree: int = 3,
        decoder_depth: int | None = None,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        encoder_mask: EncoderMask = "causal",
        decoder_window: int | None = None,
        encoder_encoding: str | None = None,
        encoding_options: Mapping[str, object] | None = None,
        max_len: int = 4096,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        for name, v in (("in_dim", in_dim), ("dim", dim), ("depth", depth), ("num_heads", num_heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        self.degree = _check_degree(degree)
        self.num_control_points = _check_num_control(num_control_points, self.degree, "num_control_points")
        decoder_depth = depth if decoder_depth is None else check_int("decoder_depth", decoder_depth, minimum=1)
        if encoder_mask not in ENCODER_MASKS:
            raise ValueError(f"encoder_mask must be one of {', '.join(ENCODER_MASKS)}; got {encoder_mask!r}")
        if decoder_window is not None:
            check_int("decoder_window", decoder_window, minimum=1)  # True is an int to Python, never a size
        self.in_dim, self.dim = in_dim, dim
        self.encoder_mask, self.decoder_window = encoder_mask, decoder_window
        self.encoder_encoding = _build_encoding(encoder_encoding, encoding_options, dim, num_heads, max_len)
        self.in_proj = nn.Linear(in_dim, dim)
        self.control_tokens = nn.Parameter(torch.randn(num_control_points, dim) * 0.02)
        self.encoder = TransformerEncoder(dim, depth, num_heads, encoding=attention_part(self.encoder_encoding),
                                          mlp_ratio=mlp_ratio, dropout=dropout, backend=backend)
        self.to_control = nn.Linear(dim, dim)
        self.decoder = TransformerEncoder(
            dim, decoder_depth, num_heads, mlp_ratio=mlp_ratio, dropout=dropout, backend=backend
        )
        self.out_proj = nn.Linear(dim, in_dim)

    def _check_input(self, x: object) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.in_dim or x.shape[1] < 1:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be [batch, length >= 1, in_dim={self.in_dim}]; got {shape}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"x must be floating point; got dtype {x.dtype}")
        return x

    def encode(self, x: Tensor) -> Tensor:
        """Control points ``[B, K, D]`` of the sequences ``x [B, L, in_dim]``."""
        x = self._check_input(x)
        b, length, _ = x.shape
        h = self.in_proj(x)
        enc, positions = self.encoder_encoding, None
        if enc is not None:
            seq_pos = torch.arange(length, device=x.device).unsqueeze(0)
            if Hook.INPUT in enc.hooks:
                h = enc.encode_input(h, seq_pos)
            positions = torch.cat((seq_pos.float(), spread_positions(seq_pos, self.num_control_points)), dim=1)
        tokens = torch.cat((h, self.control_tokens.expand(b, -1, -1)), dim=1)
        mask = AttentionMask(causal=True) if self.encoder_mask == "causal" else None
        h = self.encoder(tokens, mask=mask, positions=positions)  # without an encoding, positions are unused
        return self.to_control(h[:, length:])

    def trajectory(self, control_points: Tensor, length: int) -> Tensor:
        """The latent samples ``s(t_i)``, ``t_i = i / (length - 1)``: ``[B, length, D]``."""
        length = _check_length(length, "length")
        self._check_control_points(control_points)
        t = uniform_times(length, dtype=control_points.dtype, device=control_points.device)
        return evaluate_spline(control_points, t, self.degree)

    def _check_control_points(self, control_points: object) -> None:
        expected = (self.num_control_points, self.dim)
        if not isinstance(control_points, Tensor) or control_points.dim() != 3 or tuple(control_points.shape[1:]) != expected:
            shape = tuple(control_points.shape) if isinstance(control_points, Tensor) else type(control_points).__name__
            raise ValueError(
                f"control_points must be [batch, num_control_points={expected[0]}, dim={expected[1]}]; got {shape}"
            )

    def decode(self, control_points: Tensor, length: int) -> Tensor:
        """The sequence ``[B, length, in_dim]`` decoded from ``control_points [B, K, D]`` (as
        :meth:`encode` returns them, possibly edited), for any ``length >= 1``."""
        samples = self.trajectory(control_points, length)
        mask = AttentionMask(window=self.decoder_window) if self.decoder_window is not None else None
        return self.out_proj(self.decoder(samples, mask=mask))

    def forward(self, x: Tensor, out_length: int | None = None) -> Tensor:
        """Reconstruct ``x [B, L, in_dim]`` at ``out_length`` points (default ``L``): ``[B, out_length, in_dim]``."""
        if out_length is not None:
            _check_length(out_length, "out_length")
        x = self._check_input(x)
        return self.decode(self.encode(x), x.shape[1] if out_length is None else out_length)


__all__ = [
    "ENCODER_MASKS", "SplineTransformer", "bspline_basis", "clamped_uniform_knots", "evaluate_spline",
    "greville_abscissae", "local_bspline_basis", "uniform_times",
]
