"""The training loop: shuffled batches, updates, clipping, evaluation, early stopping, checkpoints.

One training step is::

    batch = stream.next_batch()            # shuffled by the data generator
    model.zero_grad()
    result = objective(model, batch)       # forward, loss, backward
    norm = global gradient norm            # checked: finite, else stop
    clip gradients to clip_norm            # optional
    optimizer.step()                       # lr from the optimizer (or its schedule)

A :class:`~tinyformer.training.loop.Trainer` repeats it up to a step or epoch budget, logs a row of
:class:`~tinyformer.training.history.History` every ``log_every`` steps,
evaluates every ``eval_every`` steps (the model in evaluation mode, dropout
off, then back to training mode), stops early when :class:`~tinyformer.training.evaluation.EarlyStopping`
says so, and can save and load checkpoints that resume the run exactly.

A loss or gradient norm that is NaN or infinite stops training with
:class:`~tinyformer.training.loop.DivergenceError` before the update: the weights stay those of the last
good step and no checkpoint on disk is touched.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tinyformer._validation import (
    NonFiniteError,
    describe,
    generator,
    positive_float,
    positive_int,
)
from tinyformer.checkpoint import read_checkpoint, save_checkpoint
from tinyformer.data.batching import PairDataset
from tinyformer.module import Module
from tinyformer.optim import Optimizer, clip_grad_norm, grad_norm
from tinyformer.runtime import blas_threads, retain_freed_memory, threads_for, user_thread_setting
from tinyformer.training.batches import BatchStream, Dataset, WindowDataset
from tinyformer.training.evaluation import EarlyStopping
from tinyformer.training.history import History
from tinyformer.training.objectives import Objective, StepResult

__all__ = ["DivergenceError", "Trainer"]

Evaluate = Callable[[Module], Mapping[str, float]]


class DivergenceError(FloatingPointError):
    """Training diverged: a step's loss, gradient norm or activations are NaN or infinite.

    The failing step is not applied, so the weights are those after the step before.

    Attributes
    ----------
    step : int
        The step (counted from 1) that failed.
    quantity : str
        ``"loss"``, ``"gradient norm"``, or ``"activations"`` when values inside the
        forward pass overflowed to NaN or inf (the weights grew too large to use).
    value : float
    """

    def __init__(self, step: int, quantity: str, value: float) -> None:
        super().__init__(
            f"training diverged at step {step}: the {quantity} is {value}; the step was not"
            " applied, so the weights are those after the previous step"
            " (try a smaller learning rate, warm-up or gradient clipping)"
        )
        self.step, self.quantity, self.value = step, quantity, value


class _Interval:
    """Running sums over the steps since the last logged row."""

    def __init__(self, loss: float = 0.0, tokens: int = 0, correct: int = 0, seconds: float = 0.0):
        self.loss, self.tokens, self.correct, self.seconds = loss, tokens, correct, seconds

    def add(self, result: StepResult, seconds: float) -> None:
        self.loss += result.loss * result.n_tokens
        self.tokens += result.n_tokens
        self.correct += result.n_correct
        self.seconds += seconds

    def state(self) -> dict[str, float | int]:
        return {
            "loss": self.loss,
            "tokens": self.tokens,
            "correct": self.correct,
            "seconds": self.seconds,
        }


def _progress_bar(enabled: bool, total: int, initial: int) -> Any:
    """A tqdm bar on stderr if ``enabled`` and tqdm is installed, else None."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm  # noqa: PLC0415 (optional dependency, imported only when asked for)
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def _check_data_fits(model: Module, data: object) -> None:
    """Refuse training data longer than the model's context, naming the config field."""
    limit = getattr(model, "context_length", None)
    config = getattr(model, "config", None)
    if limit is None or config is None:  # a stand-in module: nothing to check
        return
    if isinstance(data, WindowDataset):
        longest, what = data.seq_len, "windows of"
    elif isinstance(data, PairDataset):
        # the decoder reads <bos> + target, the encoder the source
        longest_source = max(len(s) for s in data.sources)
        longest = max(longest_source, max(len(t) for t in data.targets) + 1)
        what = "sequences (source, or <bos> + target) of up to"
    else:
        return
    if longest > limit:
        raise ValueError(
            f"train_data has {what} {longest} tokens, longer than the model's"
            f" {type(config).__name__}.context_length={limit}: build the model with"
            f" context_length >= {longest}"
        )


class Trainer:
    """Train a model with an optimizer on shuffled mini-batches.

    Parameters
    ----------
    model : Module
        An :class:`~tinyformer.models.encoder_decoder.EncoderDecoder`, a
        :class:`~tinyformer.models.decoder_only.DecoderOnlyLM` or any module the objective can run.
    optimizer : Optimizer
        Over the model's parameters; its ``lr`` may be a schedule.
    objective : Objective
        ``objective(model, batch, backward=True) -> StepResult``, e.g.
        :func:`~tinyformer.training.objectives.seq2seq_loss` or :func:`~tinyformer.training.objectives.lm_loss`.
    train_data : Dataset
        A :class:`~tinyformer.data.batching.PairDataset` or :class:`~tinyformer.training.batches.WindowDataset`.
    batch_size : int
    rng : numpy.random.Generator
        Shuffles the training data (one permutation per epoch).
    clip_norm : float, optional
        Rescale the gradients so that their global norm is at most this.
    evaluate : callable, optional
        ``evaluate(model) -> dict of metrics``, e.g. a :class:`~tinyformer.training.evaluation.LossEvaluator`
        on held-out data. Run with the model in evaluation mode.
    eval_every : int, optional
        Evaluate after every ``eval_every`` steps; with ``evaluate`` and no
        ``eval_every``, only at the end of :meth:`fit`. The last step of a
        :meth:`fit` is always evaluated when ``evaluate`` is given.
    early_stopping : EarlyStopping, optional
        Checked after each evaluation (needs ``evaluate``).
    log_every : int
        Log a history row every ``log_every`` steps, and at the end of :meth:`fit`
        (so a run interrupted and resumed between two rows has one more row).
    progress : bool
        Show a tqdm progress bar on stderr (if tqdm is installed; without it,
        or with ``progress=False``, nothing is printed).
    checkpoint_path : str or path-like, optional
        Where :meth:`fit` saves a checkpoint every ``checkpoint_every`` steps
        and when it ends.
    checkpoint_every : int, optional
    threads : int, str or None
        BLAS threads while :meth:`fit` trains. ``"auto"`` (the default) asks
        :func:`~tinyformer.runtime.threads_for` about the model's largest matrix product
        (``2 * batch_size * context_length * d_model * d_ff``), unless the
        environment sets a thread count (``OMP_NUM_THREADS`` and the like), which
        wins; an int sets the count; None leaves BLAS as it is (explained in
        :mod:`tinyformer.runtime`).
    retain_memory : bool
        Call :func:`~tinyformer.runtime.retain_freed_memory` before training: glibc
        then keeps freed memory for reuse, which saves page faults at every step,
        for the rest of the process. Off by default, since it changes the C
        allocator of the whole process, not only of the trainer.

    Attributes
    ----------
    step : int
        Updates made so far.
    history : History
    stop_reason : str or None
        Why the last :meth:`fit` ended: ``"budget"``, ``"target"`` or ``"patience"``.
    """

    def __init__(
        self,
        model: Module,
        optimizer: Optimizer,
        objective: Objective,
        train_data: Dataset,
        *,
        batch_size: int,
        rng: np.random.Generator,
        clip_norm: float | None = None,
        evaluate: Evaluate | None = None,
        eval_every: int | None = None,
        early_stopping: EarlyStopping | None = None,
        log_every: int = 1,
        progress: bool = False,
        checkpoint_path: str | os.PathLike[str] | None = None,
        checkpoint_every: int | None = None,
        threads: int | str | None = "auto",
        retain_memory: bool = False,
    ) -> None:
        if not isinstance(model, Module):
            raise TypeError(f"model must be a tinyformer Module, got {describe(model)}")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a tinyformer Optimizer, got {describe(optimizer)}")
        own = {id(p) for p in model.parameters()}
        if any(id(p) not in own for p in optimizer.parameters):
            raise ValueError("optimizer must update parameters of this model, got foreign ones")
        if not callable(objective):
            raise TypeError(f"objective must be callable, got {describe(objective)}")
        if evaluate is not None and not callable(evaluate):
            raise TypeError(f"evaluate must be callable or None, got {describe(evaluate)}")
        if early_stopping is not None:
            if not isinstance(early_stopping, EarlyStopping):
                raise TypeError(
                    f"early_stopping must be an EarlyStopping, got {describe(early_stopping)}"
                )
            if evaluate is None:
                raise ValueError("early_stopping needs evaluate: it watches evaluation metrics")
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be a bool, got {describe(progress)}")
        if checkpoint_every is not None and checkpoint_path is None:
            raise ValueError("checkpoint_every needs a checkpoint_path")
        _check_data_fits(model, train_data)
        self.model, self.optimizer, self.objective = model, optimizer, objective
        self.stream = BatchStream(train_data, batch_size, rng=generator(rng))
        self.clip_norm = None if clip_norm is None else positive_float(clip_norm, "clip_norm")
        self.evaluate = evaluate
        self.eval_every = None if eval_every is None else positive_int(eval_every, "eval_every")
        self.early_stopping = early_stopping
        self.log_every = positive_int(log_every, "log_every")
        self.progress = progress
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = (
            None
            if checkpoint_every is None
            else positive_int(checkpoint_every, "checkpoint_every")
        )
        if threads is not None and threads != "auto":
            threads = positive_int(threads, "threads")
        self.threads = threads
        if not isinstance(retain_memory, bool):
            raise TypeError(f"retain_memory must be True or False, got {describe(retain_memory)}")
        self.retain_memory = retain_memory
        self.step = 0
        self.history = History()
        self.stop_reason: str | None = None
        self._interval = _Interval()
        self._train_seconds = 0.0

    # ------------------------------------------------------------------- steps
    def train_step(self) -> tuple[StepResult, float, float]:
        """Make one update; return the batch's result, the gradient norm before clipping and the lr.

        Raises
        ------
        DivergenceError
            If the loss or the gradient norm is not finite (nothing is updated).
        """
        batch = self.stream.next_batch()
        self.model.zero_grad()
        next_step = self.step + 1
        # a diverging model overflows: we check the results ourselves and stop with a clear error
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            try:
                result = self.objective(self.model, batch, backward=True)
            except NonFiniteError as err:  # values overflowed inside the forward pass
                raise DivergenceError(next_step, "activations", math.nan) from err
            if not isinstance(result, StepResult):
                raise TypeError(f"the objective must return a StepResult, got {describe(result)}")
            if not math.isfinite(result.loss):
                raise DivergenceError(next_step, "loss", result.loss)
            norm = grad_norm(self.optimizer.parameters)
        if not math.isfinite(norm):
            raise DivergenceError(next_step, "gradient norm", norm)
        if self.clip_norm is not None:
            clip_grad_norm(self.optimizer.parameters, self.clip_norm)
        lr = self.optimizer.lr
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow shows at the next step
            self.optimizer.step()
        self.step = next_step
        return result, norm, lr

    def run_evaluation(self) -> dict[str, float]:
        """Evaluate the model (in evaluation mode), log the metrics, return them."""
        if self.evaluate is None:
            raise ValueError("this trainer has no evaluate function")
        was_training = self.model.training
        self.model.eval()
        try:
            metrics = dict(self.evaluate(self.model))
        finally:
            self.model.train(was_training)
        self.history.log_eval(self.step, metrics)
        return metrics

    def _log(self, norm: float, lr: float) -> None:
        interval = self._interval
        self.history.log_train(
            step=self.step,
            loss=interval.loss / interval.tokens if interval.tokens else math.nan,
            accuracy=interval.correct / interval.tokens if interval.tokens else math.nan,
            lr=lr,
            grad_norm=norm,
            tokens_per_second=interval.tokens / interval.seconds if interval.seconds else math.nan,
            time=self._train_seconds,
        )
        self._interval = _Interval()

    # --------------------------------------------------------------------- fit
    def _budget(self, max_steps: int | None, max_epochs: int | None) -> int:
        if max_steps is None and max_epochs is None:
            raise ValueError("give max_steps, max_epochs or both; got neither")
        budgets = []
        if max_steps is not None:
            budgets.append(positive_int(max_steps, "max_steps"))
        if max_epochs is not None:
            budgets.append(positive_int(max_epochs, "max_epochs") * self.stream.steps_per_epoch)
        return min(budgets)

    def fit(self, max_steps: int | None = None, *, max_epochs: int | None = None) -> History:
        """Train until ``max_steps`` updates or ``max_epochs`` epochs in all, or an early stop.

        Both budgets count from the start of training, not of this call: a
        trainer resumed from a checkpoint at step 300 with ``fit(max_steps=500)``
        makes 200 more updates.

        Returns
        -------
        History
            ``self.history``.
        """
        budget = self._budget(max_steps, max_epochs)
        if self.retain_memory:
            retain_freed_memory()
        with blas_threads(self.blas_thread_count()):
            return self._fit(budget)

    def blas_thread_count(self) -> int | None:
        """The BLAS threads :meth:`fit` uses (None: as they are); see ``threads``."""
        if self.threads != "auto":
            return self.threads
        if user_thread_setting() is not None:
            return None  # the user's own setting wins
        config = getattr(self.model, "config", None)
        sizes = [getattr(config, name, None) for name in ("d_model", "d_ff")]
        context = getattr(config, "context_length", None)  # every model config's name for it
        if context is None or not all(isinstance(n, int) for n in sizes):
            return None  # not a transformer of this library: nothing to go by
        d_model, d_ff = sizes
        return threads_for(2.0 * self.stream.batch_size * context * d_model * d_ff)

    def _fit(self, budget: int) -> History:
        self.model.train()
        self.stop_reason = "budget"
        bar = _progress_bar(self.progress, budget, min(self.step, budget))
        result, norm, lr = None, math.nan, math.nan
        try:
            while self.step < budget:
                start = time.perf_counter()
                result, norm, lr = self.train_step()
                seconds = time.perf_counter() - start
                self._train_seconds += seconds
                self._interval.add(result, seconds)
                last = self.step == budget
                if self.step % self.log_every == 0 or last:
                    self._log(norm, lr)
                stop = None
                if self.evaluate is not None and (
                    last or (self.eval_every is not None and self.step % self.eval_every == 0)
                ):
                    metrics = self.run_evaluation()
                    if self.early_stopping is not None:
                        stop = self.early_stopping.update(metrics)
                if stop is not None and self._interval.tokens:
                    self._log(norm, lr)
                if self.checkpoint_every is not None and (
                    self.step % self.checkpoint_every == 0 or last or stop
                ):
                    self.save(self.checkpoint_path)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(self._postfix(), refresh=False)
                if stop is not None:
                    self.stop_reason = stop
                    break
            if self.checkpoint_path is not None and self.checkpoint_every is None:
                self.save(self.checkpoint_path)
        finally:
            if bar is not None:
                bar.close()
        return self.history

    def _postfix(self) -> dict[str, str]:
        shown = {}
        if self.history.train:
            row = self.history.train[-1]
            shown["loss"] = f"{row['loss']:.4f}"
            shown["acc"] = f"{row['accuracy']:.3f}"
        last_eval = self.history.last_eval
        if last_eval is not None:
            for key, value in last_eval.items():
                if key != "step" and len(shown) < 5:
                    shown[f"eval_{key}"] = f"{value:.4g}"
        return shown

    # ------------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike[str]) -> None:
        """Save a checkpoint from which :meth:`load` resumes this run exactly."""
        position, order = self.stream.state()
        extra = {
            "trainer": {
                "stream": position,
                "interval": self._interval.state(),
                "train_seconds": self._train_seconds,
                "early_stopping": None
                if self.early_stopping is None
                else self.early_stopping.state(),
            }
        }
        save_checkpoint(
            path,
            self.model,
            self.optimizer,
            step=self.step,
            history=self.history,
            generators={"data": self.stream.rng},
            extra=extra,
            extra_arrays={"stream_order": order},
        )

    def load(self, path: str | os.PathLike[str]) -> None:
        """Resume from a checkpoint of :meth:`save`: weights, optimizer, generators, data order, history.

        Everything is checked before anything changes: on a bad file a
        :class:`ValueError` naming it is raised and the trainer, model and
        optimizer are left as they were.
        """
        checkpoint = read_checkpoint(path)
        generators = {"data": self.stream.rng}
        try:
            state = checkpoint.extra["trainer"]
            order = checkpoint.group("extra")["stream_order"]
            self.stream.check_state(state["stream"], order)
            history = History.from_dict(checkpoint.history or {})
            interval = _Interval(**state["interval"])
            seconds = float(state["train_seconds"])
            stopping = state["early_stopping"]
            if (stopping is None) != (self.early_stopping is None):
                raise ValueError("early stopping was used in one run and not in the other")
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"checkpoint {checkpoint.path}: no usable trainer state ({err})"
            ) from err
        # restore checks the model, optimizer and generator states before it assigns any
        checkpoint.restore(self.model, self.optimizer, generators=generators)
        self.stream.set_state(state["stream"], order)
        if self.early_stopping is not None:
            self.early_stopping.set_state(stopping)
        self.step = checkpoint.step
        self.history, self._interval, self._train_seconds = history, interval, seconds
