r"""A mixture of experts on a mixture of Markov sources: does the router sort the sources.

The data are windows drawn from ``n_sources`` random Markov sources
(:meth:`MarkovSource.random <tinyformer.data.markov.MarkovSource.random>`, each
with a seed of its own) on one vocabulary: every window comes entirely from one
source, picked uniformly at random. A model that reads a window's first tokens
can tell which source is speaking and then predict like that source. The best
possible predictor is the Bayes mixture (:func:`bayes_losses`): it keeps a
posterior over the sources, updated token by token, and its loss tends to the
entropy rate of the window's source once the posterior has settled.

:func:`moe_lm` trains one decoder-only model on these windows, either with a
mixture-of-experts feed-forward network in every block
(:class:`~tinyformer.moe.MixtureOfExperts`) or with a dense gated one, and
measures on held-out windows its loss against the Bayes optimum and, for a
mixture of experts, where the router sends each source's tokens
(:func:`routing_counts`), how balanced the experts' loads are and how many
assignments a capacity limit drops. :func:`book_runs` lists the runs of the
chapter "Mixture of experts": a mixture of experts with and without the
load-balancing loss, the two dense models with its active and its total
parameters, each over :data:`SEEDS`, and the capacity factors :data:`CAPACITY_FACTORS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tinyformer._validation import non_negative_float, positive_float, positive_int
from tinyformer.data import MarkovSource
from tinyformer.experiments.recipe import Recipe, token_losses
from tinyformer.experiments.result import ExperimentResult
from tinyformer.models import DecoderOnlyConfig
from tinyformer.models.counting import active_parameter_count, parameter_count
from tinyformer.module import no_grad
from tinyformer.moe import MixtureOfExperts
from tinyformer.training import WindowDataset

__all__ = [
    "AUX_LOSS_WEIGHT",
    "CAPACITY_FACTORS",
    "CAPACITY_SEEDS",
    "SEEDS",
    "bayes_losses",
    "book_runs",
    "conditional_mutual_information_bits",
    "mixture_task",
    "moe_layers",
    "moe_lm",
    "mutual_information_bits",
    "routing_counts",
]

SEEDS = (0, 1, 2, 3, 4)
"""Seeds of every compared model (initialization, training windows, batch order)."""
CAPACITY_SEEDS = (0, 1, 2)
"""Seeds of the capacity-factor runs (each compared with the same seed without a limit)."""
AUX_LOSS_WEIGHT = 0.01
"""The load-balancing loss's weight in the book's runs, the Switch Transformer's value."""
CAPACITY_FACTORS = (1.0, 1.25)
"""Capacity factors of the chapter's dropped-token runs (the others have no limit)."""
FEED_FORWARD_KINDS = ("moe", "gated")


def mixture_task(
    source_seed: int, n_sources: int, vocab_size: int, order: int, branching: int
) -> tuple[list[MarkovSource], Callable[[int, int, Any], tuple[WindowDataset, np.ndarray]]]:
    """The sources of the mixture, and a maker of windows labelled with their source.

    Source ``s`` is ``MarkovSource.random(vocab_size, order, branching)`` drawn
    from the generator ``[source_seed, 0, s]``. ``windows(n, length, stream)``
    draws ``n`` windows of ``length`` tokens from the random stream
    ``[source_seed, *stream]`` (an int or a tuple of ints): for each window a
    source, uniformly, then a stationary window of that source. It returns the
    windows and the source of each, ``(n,)``.
    """
    n_sources = positive_int(n_sources, "n_sources")
    sources = [
        MarkovSource.random(
            vocab_size, order, branching, rng=np.random.default_rng([source_seed, 0, s])
        )
        for s in range(n_sources)
    ]

    def windows(n: int, length: int, stream: Any) -> tuple[WindowDataset, np.ndarray]:
        n, length = positive_int(n, "n"), positive_int(length, "length")
        keys = list(stream) if isinstance(stream, tuple | list) else [stream]
        rng = np.random.default_rng([source_seed, *keys])
        which = rng.integers(0, n_sources, size=n)  # (n,)
        inputs = np.empty((n, length), dtype=np.int64)
        targets = np.empty((n, length), dtype=np.int64)
        for s, source in enumerate(sources):
            rows = np.flatnonzero(which == s)
            if rows.size:
                inputs[rows], targets[rows] = source.sample_windows(rows.size, length, rng)
        return WindowDataset(inputs, targets), which

    return sources, windows


def _source_probabilities(
    source: MarkovSource, inputs: np.ndarray, targets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Under one source: p(first token) ``(n,)`` and p(target t | window up to t) ``(n, T)``."""
    k = source.order
    stream = np.concatenate([inputs[:, :1], targets], axis=1)  # (n, T + 1)
    pi = source.stationary
    marginals = [pi.sum(axis=tuple(range(j, k))) for j in range(1, k + 1)]  # first j tokens
    first = marginals[0][stream[:, 0]]  # (n,)
    probs = np.empty(targets.shape)
    for t in range(targets.shape[1]):
        if t + 1 < k:  # a partial context: ratio of stationary marginals
            joint_next = marginals[t + 1][tuple(stream[:, : t + 2].T)]
            joint_now = marginals[t][tuple(stream[:, : t + 1].T)]
            probs[:, t] = joint_next / joint_now
        else:
            table = source.next_token_probs(stream[:, t + 1 - k : t + 1])  # (n, V)
            probs[:, t] = table[np.arange(len(stream)), stream[:, t + 1]]
    return first, probs


def bayes_losses(
    sources: list[MarkovSource], inputs: object, targets: object
) -> tuple[np.ndarray, np.ndarray]:
    r"""The loss of the best possible predictor of the mixture, and its posterior over sources.

    With the sources equally likely a priori, the predictor's probability for
    target :math:`t` given the window so far :math:`x_{\le t}` is

    .. math::
        q(x_{t+1} \mid x_{\le t}) = \sum_s w_s(t)\, p_s(x_{t+1} \mid x_{\le t}),
        \qquad w_s(t) \propto p_s(x_0) \prod_{i < t} p_s(x_{i+1} \mid x_{\le i}),

    the posterior :math:`w(t)` of the sources given the tokens seen (each
    :math:`p_s` is the stationary chain of source :math:`s`). No predictor has a
    lower expected loss.

    Parameters
    ----------
    sources : list of MarkovSource
        The mixture's sources (one vocabulary).
    inputs, targets : array_like of int
        ``(n, T)`` windows, ``targets[:, t]`` following ``inputs[:, t]``.

    Returns
    -------
    losses : numpy.ndarray
        ``(n, T)``: :math:`-\log q` of every target, nats.
    posterior : numpy.ndarray
        ``(n, T, S)``: :math:`w(t)`, the posterior used to predict target :math:`t`.
    """
    inputs = np.asarray(inputs)
    targets = np.asarray(targets)
    if inputs.ndim != 2 or inputs.shape != targets.shape or inputs.dtype.kind not in "iu":
        raise ValueError(
            f"inputs and targets must be integer arrays of one shape (n, T), got {inputs.shape}"
            f" and {targets.shape}"
        )
    if not sources:
        raise ValueError("sources must hold at least one MarkovSource, got none")
    parts = [_source_probabilities(s, inputs, targets) for s in sources]
    first = np.stack([f for f, _ in parts], axis=-1)  # (n, S)
    probs = np.stack([p for _, p in parts], axis=-1)  # (n, T, S)
    n, steps = targets.shape
    posterior = np.empty((n, steps, len(sources)))
    weight = first / first.sum(axis=-1, keepdims=True)  # after the first token
    losses = np.empty((n, steps))
    for t in range(steps):
        posterior[:, t] = weight
        mixed = (weight * probs[:, t]).sum(axis=-1)  # (n,)
        losses[:, t] = -np.log(mixed)
        weight = weight * probs[:, t] / mixed[:, None]  # Bayes' rule, normalized
    return losses, posterior


def moe_layers(model: Any) -> list[MixtureOfExperts]:
    """The model's mixtures of experts, first block first (empty for a dense model)."""
    return [m for m in model.modules() if isinstance(m, MixtureOfExperts)]


def routing_counts(
    model: Any,
    inputs: object,
    labels: object,
    *,
    n_labels: int,
    from_position: int = 0,
    batch_size: int = 32,
) -> tuple[np.ndarray, np.ndarray]:
    """Where each layer's router sends the tokens of each label, counted on ``inputs``.

    The model runs on ``inputs`` ``(n, T)``, ``batch_size`` windows per forward
    pass (with a capacity limit, what is dropped depends on the tokens of a
    pass), without keeping anything for a backward pass. ``labels`` gives each
    token a class in ``[0, n_labels)``: shape ``(n,)`` (one per window, e.g. its
    source) or ``(n, T)`` (one per token, e.g. the token itself). Positions
    before ``from_position`` are left out.

    Returns
    -------
    counts : numpy.ndarray
        ``(n_layers, n_labels, k, E)`` int: ``counts[l, c, r, e]`` is the number
        of tokens of class ``c`` whose choice of rank ``r`` (0: the most probable
        expert) in layer ``l`` was expert ``e``.
    dropped : numpy.ndarray
        ``(n_layers, n_labels, k)`` int: of those, the assignments the capacity dropped.
    """
    inputs = np.asarray(inputs)
    labels = np.asarray(labels)
    n_labels = positive_int(n_labels, "n_labels")
    batch_size = positive_int(batch_size, "batch_size")
    layers = moe_layers(model)
    if not layers:
        raise ValueError("model has no MixtureOfExperts layer to count the routing of")
    if inputs.ndim != 2:
        raise ValueError(f"inputs must have shape (n, T), got {inputs.shape}")
    if labels.shape == inputs.shape[:1]:
        labels = np.broadcast_to(labels[:, None], inputs.shape)
    if labels.shape != inputs.shape or labels.dtype.kind not in "iu":
        raise ValueError(
            f"labels must be integers of shape (n,) or (n, T) = {inputs.shape}, got {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= n_labels):
        raise ValueError(f"labels must lie in [0, {n_labels}), got {labels.min()}..{labels.max()}")
    if not 0 <= from_position < inputs.shape[1]:
        raise ValueError(f"from_position must be in [0, {inputs.shape[1]}), got {from_position}")
    n_experts, k = layers[0].n_experts, layers[0].top_k
    counts = np.zeros((len(layers), n_labels, k, n_experts), dtype=np.int64)
    dropped = np.zeros((len(layers), n_labels, k), dtype=np.int64)
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            for start in range(0, len(inputs), batch_size):
                rows = slice(start, start + batch_size)
                model.forward(inputs[rows])
                label = labels[rows, from_position:]  # (b, T')
                for li, layer in enumerate(layers):
                    choices = layer.routing.choices[:, from_position:]  # (b, T', k)
                    kept = layer.routing.kept[:, from_position:]
                    for r in range(k):
                        np.add.at(counts[li], (label, r, choices[..., r]), 1)
                        np.add.at(dropped[li], (label, r), ~kept[..., r])
    finally:
        model.train(was_training)
    return counts, dropped


def mutual_information_bits(joint: object) -> float:
    r"""Mutual information :math:`I(A; B)` in bits of a table of counts ``(|A|, |B|)``.

    .. math:: I = \sum_{a, b} p(a, b) \log_2 \frac{p(a, b)}{p(a)\, p(b)}
    """
    table = np.asarray(joint, dtype=np.float64)
    if table.ndim != 2 or (table < 0).any() or table.sum() <= 0:
        raise ValueError(f"joint must be a 2-D table of non-negative counts, got {table.shape}")
    p = table / table.sum()
    outer = p.sum(axis=1, keepdims=True) * p.sum(axis=0, keepdims=True)
    nonzero = p > 0
    return float((p[nonzero] * np.log2(p[nonzero] / outer[nonzero])).sum())


def conditional_mutual_information_bits(joint: object) -> float:
    r"""Conditional mutual information :math:`I(A; B \mid C)` in bits of counts ``(|C|, |A|, |B|)``.

    .. math:: I(A; B \mid C) = \sum_c p(c)\, I(A; B \mid C = c),

    each term :func:`mutual_information_bits` of the slice ``joint[c]`` (slices
    without counts weigh nothing).
    """
    table = np.asarray(joint, dtype=np.float64)
    if table.ndim != 3 or (table < 0).any() or table.sum() <= 0:
        raise ValueError(f"joint must be a 3-D table of non-negative counts, got {table.shape}")
    weights = table.sum(axis=(1, 2)) / table.sum()  # p(c)
    return float(
        sum(w * mutual_information_bits(t) for w, t in zip(weights, table, strict=True) if w > 0)
    )


def _routing_metrics(
    model: Any,
    heldout: WindowDataset,
    which: np.ndarray,
    n_sources: int,
    vocab_size: int,
    from_position: int,
    batch_size: int,
) -> dict[str, float]:
    """Per layer: source/expert and token/expert information, load balance, dropped share."""
    by_pair, dropped_by_pair = routing_counts(
        model, heldout.inputs, heldout.inputs * n_sources + which[:, None],
        n_labels=vocab_size * n_sources, from_position=from_position, batch_size=batch_size,
    )  # fmt: skip
    n_layers, _, k, n_experts = by_pair.shape
    by_pair = by_pair.reshape(n_layers, vocab_size, n_sources, k, n_experts)
    by_source, by_token = by_pair.sum(axis=1), by_pair.sum(axis=2)  # (L, S, k, E), (L, V, k, E)
    dropped = dropped_by_pair.reshape(n_layers, vocab_size, n_sources, k).sum(axis=1)
    pairs = by_pair[:, :, :, 0]  # first choices by (token, source): (L, V, S, E)
    metrics = {"source_token_information_bits": mutual_information_bits(pairs[0].sum(axis=-1))}
    for li in range(len(by_source)):
        first = by_source[li, :, 0]  # (S, E): first choices
        load = by_source[li].sum(axis=(0, 1)) / by_source[li].sum()  # (E,) every assignment
        metrics[f"source_information_bits_{li}"] = mutual_information_bits(first)
        metrics[f"token_information_bits_{li}"] = mutual_information_bits(by_token[li, :, 0])
        given_token = conditional_mutual_information_bits(pairs[li])
        metrics[f"conditional_source_information_bits_{li}"] = given_token
        metrics[f"max_load_{li}"] = float(load.max() * n_experts)  # 1 when balanced
        metrics[f"min_load_{li}"] = float(load.min() * n_experts)
        metrics[f"dropped_fraction_{li}"] = float(dropped[li].sum() / by_source[li].sum())
    return metrics


def moe_lm(
    *,
    seed: int = 0,
    feed_forward: str = "moe",
    d_ff: int = 32,
    n_experts: int = 4,
    experts_per_token: int = 2,
    capacity_factor: float | None = None,
    aux_loss_weight: float = 0.0,
    source_seed: int = 0,
    n_sources: int = 4,
    vocab_size: int = 16,
    order: int = 1,
    branching: int = 4,
    d_model: int = 32,
    n_heads: int = 4,
    n_layers: int = 2,
    context_length: int = 32,
    batch_size: int = 32,
    max_steps: int = 300,
    peak_lr: float = 1e-2,
    warmup_steps: int = 30,
    n_heldout_windows: int = 512,
    from_position: int = 8,
    log_every: int = 25,
    dtype: str = "float32",
    progress: bool = False,
) -> ExperimentResult:
    r"""Train a decoder-only model on a mixture of Markov sources; measure loss and routing.

    Pre-norm blocks (LayerNorm), learned positions, no biases, and either a
    mixture of ``n_experts`` gated (SwiGLU) experts of width ``d_ff`` with
    ``experts_per_token`` experts per token (``feed_forward="moe"``), or one
    dense gated network of width ``d_ff`` (``feed_forward="gated"``): the dense
    model with the mixture's *active* parameters has ``d_ff = k d_\text{expert}``,
    the one with its *total* parameters ``d_ff = E d_\text{expert}`` (each up to
    the router's ``d_model * n_experts`` weights per block). The training
    windows (``max_steps * batch_size`` of them, each seen once) come from the
    stream ``[source_seed, 1, seed]`` of :func:`mixture_task`, the held-out
    windows from ``[source_seed, 3]``, the same for every run. Training is the
    book's :class:`~tinyformer.experiments.recipe.Recipe` with clipping at 1; the
    objective adds ``aux_loss_weight`` times each block's load-balancing loss.

    Parameters
    ----------
    seed : int
        Seeds the training windows, the initialization and the batch order.
    feed_forward : str
        ``"moe"`` or ``"gated"`` (dense).
    d_ff : int
        Each expert's width (mixture) or the network's width (dense).
    n_experts, experts_per_token : int
        :math:`E` and :math:`k` of the mixture.
    capacity_factor : float or None
        The experts' capacity factor (None: no limit). Mixture only.
    aux_loss_weight : float
        Weight of the load-balancing loss (0: none). Mixture only.
    source_seed, n_sources, vocab_size, order, branching : int
        The sources (:func:`mixture_task`).
    d_model, n_heads, n_layers, context_length : int
        The rest of the model's shape.
    batch_size, max_steps, peak_lr, warmup_steps : int, int, float, int
        Optimization settings; held-out windows are also run ``batch_size`` at a
        time, so a capacity applies to passes of the size training used.
    n_heldout_windows : int
        Windows of the held-out stream.
    from_position : int
        The routing metrics count positions from this one on, where the
        source is all but certain from the window so far.
    log_every : int
        Steps between history rows.
    dtype : str
        ``"float32"`` or ``"float64"``.
    progress : bool
        Show a progress bar.

    Returns
    -------
    ExperimentResult
        ``metrics``: ``heldout_loss`` (every held-out target) and ``bayes_loss``,
        the Bayes mixture's loss on the same targets (:func:`bayes_losses`),
        ``excess_loss`` their difference; ``late_loss``, ``late_bayes_loss``
        and ``late_excess_loss`` over targets from ``from_position`` on;
        ``entropy_rate``, the mean entropy rate of the held-out windows' sources;
        ``parameters`` and ``active_parameters``
        (:func:`~tinyformer.models.counting.parameter_count`,
        :func:`~tinyformer.models.counting.active_parameter_count`); for a
        mixture, per block ``l``: ``source_information_bits_l`` and
        ``token_information_bits_l``, the mutual information between the first
        choice of expert and the window's source, or the current token
        (:func:`mutual_information_bits`; at most :math:`\log_2 E` bits), and
        ``conditional_source_information_bits_l``, the information between the
        source and the first choice once the current token is known
        (:func:`conditional_mutual_information_bits`); ``source_token_information_bits``,
        what the current token alone says about the source (the same for every model);
        ``max_load_l`` and ``min_load_l``, the largest and smallest share of the
        assignments an expert got, times :math:`E` (1 when balanced);
        ``dropped_fraction_l``, the share of assignments the capacity dropped;
        and ``steps``, ``train_seconds`` and ``cpu_seconds``, as every run.
    """
    if feed_forward not in FEED_FORWARD_KINDS:
        raise ValueError(f"feed_forward must be one of {FEED_FORWARD_KINDS}, got {feed_forward!r}")
    aux_loss_weight = non_negative_float(aux_loss_weight, "aux_loss_weight")
    if capacity_factor is not None:
        capacity_factor = positive_float(capacity_factor, "capacity_factor")
    if feed_forward != "moe" and (capacity_factor is not None or aux_loss_weight):
        raise ValueError(
            "capacity_factor and aux_loss_weight apply to feed_forward='moe' only, got"
            f" capacity_factor={capacity_factor!r}, aux_loss_weight={aux_loss_weight!r}"
        )
    context_length = positive_int(context_length, "context_length")
    if not 0 <= from_position < context_length:
        raise ValueError(f"from_position must be in [0, {context_length}), got {from_position}")
    recipe = Recipe(seed, peak_lr, warmup_steps, max_steps, batch_size)
    sources, windows = mixture_task(source_seed, n_sources, vocab_size, order, branching)
    train, _ = windows(recipe.max_steps * recipe.batch_size, context_length, (1, seed))
    heldout, which = windows(n_heldout_windows, context_length, 3)
    experts = (
        {
            "n_experts": n_experts,
            "experts_per_token": experts_per_token,
            "expert_feed_forward": "gated",
            "expert_capacity_factor": capacity_factor,
            "router_aux_loss_weight": aux_loss_weight,
        }
        if feed_forward == "moe"
        else {}
    )
    config = DecoderOnlyConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        context_length=context_length,
        norm_first=True,
        feed_forward=feed_forward,
        activation="silu",
        bias=False,
        dtype=dtype,
        **experts,
    )
    trainer = recipe.trainer(config, train, clip_norm=1.0, log_every=log_every, progress=progress)
    trainer.fit(recipe.max_steps)
    model = trainer.model.eval()
    losses, _ = token_losses(model, heldout.inputs, heldout.targets, batch_size=recipe.batch_size)
    optimum, _ = bayes_losses(sources, heldout.inputs, heldout.targets)
    late = slice(from_position, None)
    metrics = {
        "heldout_loss": float(losses.mean()),
        "bayes_loss": float(optimum.mean()),
        "excess_loss": float(losses.mean() - optimum.mean()),
        "late_loss": float(losses[:, late].mean()),
        "late_bayes_loss": float(optimum[:, late].mean()),
        "late_excess_loss": float(losses[:, late].mean() - optimum[:, late].mean()),
        "entropy_rate": float(np.mean([sources[s].entropy_rate for s in which])),
        "parameters": float(parameter_count(config)),
        "active_parameters": float(active_parameter_count(config)),
    }
    if feed_forward == "moe":
        metrics.update(
            _routing_metrics(
                model, heldout, which, n_sources, vocab_size, from_position, recipe.batch_size
            )
        )
    settings = {
        "sources": {
            "source_seed": source_seed,
            "n_sources": n_sources,
            "vocab_size": vocab_size,
            "order": order,
            "branching": branching,
        },
        "n_heldout_windows": n_heldout_windows,
        "from_position": from_position,
    }
    return recipe.result("moe_lm", trainer, metrics, settings)


def book_runs() -> tuple[tuple[str, dict[str, Any]], ...]:
    """The runs of chapter "Mixture of experts", each once.

    Over :data:`SEEDS`: the mixture of experts (default width, :math:`E = 4`,
    :math:`k = 2`) without and with the load-balancing loss
    (:data:`AUX_LOSS_WEIGHT`), and the dense gated models of width ``k * d_ff``
    (its active parameters) and ``E * d_ff`` (its total parameters). Then the
    mixture with the loss at each of :data:`CAPACITY_FACTORS`, over :data:`CAPACITY_SEEDS`.
    """
    width, n_experts, k = 32, 4, 2
    runs: list[dict[str, Any]] = []
    for seed in SEEDS:
        runs += [
            {"seed": seed},
            {"seed": seed, "aux_loss_weight": AUX_LOSS_WEIGHT},
            {"seed": seed, "feed_forward": "gated", "d_ff": k * width},
            {"seed": seed, "feed_forward": "gated", "d_ff": n_experts * width},
        ]
    runs += [
        {"seed": seed, "aux_loss_weight": AUX_LOSS_WEIGHT, "capacity_factor": c}
        for seed in CAPACITY_SEEDS
        for c in CAPACITY_FACTORS
    ]
    return tuple(("moe_lm", params) for params in runs)
