"""Normalization layers: LayerNorm and RMSNorm over features, BatchNorm over the batch.

LayerNorm and RMSNorm rescale each position's feature vector on its own (no
statistics are shared across the batch or the sequence), then apply a learned
per-feature gain. BatchNorm, for comparison, normalizes each feature over every
position of the batch, so one token's output depends on the other tokens of its
batch. The backward passes are written out in terms of the saved normalized
input, so nothing but that and one number per row (or column) is kept; they
skip the gradient of a frozen gain or bias (``requires_grad`` False).
"""

from __future__ import annotations

import numpy as np

from tinyformer._validation import (
    float_dtype,
    layer_input,
    positive_float,
    positive_int,
    unit_interval,
)
from tinyformer.layers import sum_rows
from tinyformer.module import Module, Parameter

__all__ = ["NORMS", "BatchNorm", "LayerNorm", "RMSNorm", "make_norm"]


def _row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot products of two ``(N, d)`` matrices, shape ``(N,)``."""
    return np.einsum("ij,ij->i", a, b)


def _column_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Column-wise dot products of two ``(N, d)`` matrices, shape ``(d,)``."""
    return np.einsum("ij,ij->j", a, b)


def _row_mean(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Mean of each row of ``(N, d)``, shape ``(N,)``: a matrix-vector product, fast in BLAS.

    ``weights`` is the vector ``(d,)`` of entries ``1/d`` when the caller keeps one.
    """
    if weights is None:
        weights = np.full(x.shape[1], 1.0 / x.shape[1], dtype=x.dtype)
    return x @ weights


class LayerNorm(Module):
    r"""Layer normalization :cite:p:`ba2016layer`.

    For each feature vector :math:`x \in \mathbb{R}^d`,

    .. math::
        \mu = \frac1d \sum_i x_i, \quad
        \sigma^2 = \frac1d \sum_i (x_i - \mu)^2, \quad
        \hat x = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}}, \quad
        y = \gamma \odot \hat x + \beta.

    With :math:`g = \gamma \odot \partial L/\partial y` and
    :math:`r = (\sigma^2 + \epsilon)^{-1/2}`, the input gradient is

    .. math::
        \frac{\partial L}{\partial x}
        = r\,\Bigl(g - \overline{g} - \hat x\;\overline{g \odot \hat x}\Bigr),

    where the bars are means over the :math:`d` features: the two subtracted
    terms remove the components along the directions that the centring and
    the rescaling take away.

    Parameters
    ----------
    d_model : int
        Size of the normalized (last) axis.
    eps : float
        Added to the variance, as in PyTorch (default ``1e-5``).
    dtype : float32 or float64
        Dtype of ``gain`` (ones) and ``bias`` (zeros) and of accepted inputs.
    """

    def __init__(self, d_model: int, *, eps: float = 1e-5, dtype: object = np.float64) -> None:
        super().__init__()
        self.d_model = positive_int(d_model, "d_model")
        self.eps = positive_float(eps, "eps")
        self.dtype = float_dtype(dtype)
        self.gain = Parameter(np.ones(self.d_model, dtype=self.dtype))
        self.bias = Parameter(np.zeros(self.d_model, dtype=self.dtype))
        self._mean = np.full(self.d_model, 1.0 / self.d_model, dtype=self.dtype)  # (d,): 1/d

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Normalize ``x`` of shape ``(..., d_model)``; same shape out."""
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model)
        rows = x.reshape(-1, self.d_model)  # (N, d)
        x_hat = rows - _row_mean(rows, self._mean)[:, None]
        inv_std = (1.0 / np.sqrt(_row_dot(x_hat, x_hat) / self.d_model + self.eps))[:, None]
        x_hat *= inv_std  # (N, d)
        self._save(x.shape, x_hat, inv_std)
        y = x_hat * self.gain.value
        y += self.bias.value
        return y.reshape(x.shape)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Add into ``gain.grad`` and ``bias.grad``; return the gradient for ``x``."""
        shape, x_hat, inv_std = self._saved()
        grad = self._check_grad(grad_out, shape, self.dtype).reshape(-1, self.d_model)
        if self.gain.requires_grad:  # a frozen parameter costs nothing
            self.gain.grad += _column_dot(grad, x_hat)
        if self.bias.requires_grad:
            self.bias.grad += sum_rows(grad)
        g = grad * self.gain.value  # (N, d)
        projection = _row_dot(g, x_hat)[:, None] / self.d_model  # (N, 1)
        g -= _row_mean(g, self._mean)[:, None]
        g -= x_hat * projection
        g *= inv_std
        return g.reshape(shape)


class RMSNorm(Module):
    r"""Root-mean-square normalization :cite:p:`zhang2019root`: LayerNorm without centring.

    .. math::
        r = \Bigl(\frac1d \sum_i x_i^2 + \epsilon\Bigr)^{-1/2}, \quad
        \hat x = r\,x, \quad y = \gamma \odot \hat x,

    .. math::
        \frac{\partial L}{\partial x}
        = r\,\bigl(g - \hat x\;\overline{g \odot \hat x}\bigr),
        \qquad g = \gamma \odot \frac{\partial L}{\partial y}.

    Parameters
    ----------
    d_model : int
        Size of the normalized (last) axis.
    eps : float
        Added to the mean square (default ``1e-6``).
    dtype : float32 or float64
        Dtype of ``gain`` (ones) and of accepted inputs.
    """

    def __init__(self, d_model: int, *, eps: float = 1e-6, dtype: object = np.float64) -> None:
        super().__init__()
        self.d_model = positive_int(d_model, "d_model")
        self.eps = positive_float(eps, "eps")
        self.dtype = float_dtype(dtype)
        self.gain = Parameter(np.ones(self.d_model, dtype=self.dtype))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Normalize ``x`` of shape ``(..., d_model)``; same shape out."""
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model)
        rows = x.reshape(-1, self.d_model)  # (N, d)
        inv_rms = (1.0 / np.sqrt(_row_dot(rows, rows) / self.d_model + self.eps))[:, None]
        x_hat = rows * inv_rms
        self._save(x.shape, x_hat, inv_rms)
        return (x_hat * self.gain.value).reshape(x.shape)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Add into ``gain.grad``; return the gradient for ``x``."""
        shape, x_hat, inv_rms = self._saved()
        grad = self._check_grad(grad_out, shape, self.dtype).reshape(-1, self.d_model)
        if self.gain.requires_grad:  # a frozen parameter costs nothing
            self.gain.grad += _column_dot(grad, x_hat)
        g = grad * self.gain.value  # (N, d)
        g -= x_hat * (_row_dot(g, x_hat)[:, None] / self.d_model)
        g *= inv_rms
        return g.reshape(shape)


class BatchNorm(Module):
    r"""Batch normalization :cite:p:`ioffe2015batch` of ``(..., d_model)`` inputs, for comparison.

    In training mode each feature is normalized with the mean and variance of
    that feature over all :math:`N` positions of the batch (for ``(B, T, d)``
    input, :math:`N = BT`):

    .. math::
        \mu_j = \frac1N \sum_n x_{nj}, \quad
        \sigma_j^2 = \frac1N \sum_n (x_{nj} - \mu_j)^2, \quad
        \hat x_{nj} = \frac{x_{nj} - \mu_j}{\sqrt{\sigma_j^2 + \epsilon}}, \quad
        y_{nj} = \gamma_j \hat x_{nj} + \beta_j.

    It keeps running averages of :math:`\mu` and of the unbiased variance
    (:math:`\tfrac{N}{N-1}\sigma^2`, as PyTorch does), updated as
    :math:`m \leftarrow (1 - \text{momentum})\, m + \text{momentum}\; \mu`,
    and uses them instead in evaluation mode. The training-mode input gradient
    is LayerNorm's with rows and columns exchanged: with
    :math:`g = \gamma \odot \partial L/\partial y`, :math:`r_j = (\sigma_j^2 + \epsilon)^{-1/2}`
    and bars now meaning means over the :math:`N` positions,

    .. math::
        \frac{\partial L}{\partial x} = r\,\Bigl(g - \overline{g} - \hat x\;\overline{g \odot \hat x}\Bigr);

    in evaluation mode the statistics are constants and it is just :math:`r\,g`.

    Parameters
    ----------
    d_model : int
        Number of features (the last axis).
    eps : float
        Added to the variance (default ``1e-5``).
    momentum : float
        Weight of the current batch in the running averages, in ``(0, 1]``.
    dtype : float32 or float64
        Dtype of ``gain``, ``bias``, the running statistics and accepted inputs.

    Attributes
    ----------
    running_mean, running_var : numpy.ndarray
        ``(d_model,)``; start at zeros and ones. Not parameters: no gradient.
    """

    def __init__(
        self,
        d_model: int,
        *,
        eps: float = 1e-5,
        momentum: float = 0.1,
        dtype: object = np.float64,
    ) -> None:
        super().__init__()
        self.d_model = positive_int(d_model, "d_model")
        self.eps = positive_float(eps, "eps")
        self.momentum = unit_interval(momentum, "momentum", include_one=True)
        if self.momentum == 0:
            raise ValueError("momentum must be in (0, 1], got 0.0")
        self.dtype = float_dtype(dtype)
        self.gain = Parameter(np.ones(self.d_model, dtype=self.dtype))
        self.bias = Parameter(np.zeros(self.d_model, dtype=self.dtype))
        self.running_mean = np.zeros(self.d_model, dtype=self.dtype)
        self.running_var = np.ones(self.d_model, dtype=self.dtype)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Normalize ``x`` of shape ``(..., d_model)`` over all its positions; same shape out."""
        x = layer_input(x, "x", self.dtype, last_dim=self.d_model)
        rows = x.reshape(-1, self.d_model)  # (N, d): every position of the batch
        if self.training:
            mean, var = self._batch_statistics(rows)  # (d,), (d,)
        else:
            mean, var = self.running_mean, self.running_var
        inv_std = 1.0 / np.sqrt(var + self.eps)  # (d,)
        x_hat = (rows - mean) * inv_std  # (N, d)
        self._save(x.shape, x_hat, inv_std, self.training)
        return (x_hat * self.gain.value + self.bias.value).reshape(x.shape)

    def backward(self, grad_out: np.ndarray) -> np.ndarray:
        """Add into ``gain.grad`` and ``bias.grad``; return the gradient for ``x``."""
        shape, x_hat, inv_std, batch_statistics = self._saved()
        grad = self._check_grad(grad_out, shape, self.dtype).reshape(-1, self.d_model)
        if self.gain.requires_grad:  # a frozen parameter costs nothing
            self.gain.grad += _column_dot(grad, x_hat)
        if self.bias.requires_grad:
            self.bias.grad += sum_rows(grad)
        g = grad * self.gain.value  # (N, d)
        if batch_statistics:  # every position moved the mean and variance: two more terms
            n = g.shape[0]
            g -= sum_rows(g) / n
            g -= x_hat * (_column_dot(g, x_hat) / n)
        g *= inv_std
        return g.reshape(shape)

    def _batch_statistics(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and (biased) variance of each column; update the running averages."""
        n = rows.shape[0]
        if n < 2:
            raise ValueError(
                "x must hold at least 2 positions in training mode (a variance over one"
                f" value is 0), got {n}"
            )
        mean = sum_rows(rows) / n
        var = sum_rows((rows - mean) ** 2) / n
        m = self.momentum
        self.running_mean = (1 - m) * self.running_mean + m * mean
        self.running_var = (1 - m) * self.running_var + m * var * (n / (n - 1))
        return mean, var


NORMS: dict[str, type[LayerNorm | RMSNorm]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}
"""The norms a transformer block can be built with, by the name a configuration gives."""


def make_norm(kind: str, d_model: int, *, eps: float, dtype: object) -> LayerNorm | RMSNorm:
    """The norm named ``kind`` (a key of :data:`NORMS`) over ``d_model`` features."""
    if kind not in NORMS:
        raise ValueError(f"kind must be one of {sorted(NORMS)}, got {kind!r}")
    return NORMS[kind](d_model, eps=eps, dtype=dtype)
