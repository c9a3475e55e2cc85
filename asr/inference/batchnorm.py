"""BatchNorm's running statistics re-estimated after training, with the weights as they are
(``asr.validate --recompute-batchnorm``, ``asr.average --recompute-batchnorm``).

The running averages a model trained with are gathered over training while its weights moved, on augmented
batches with dropout on; for an averaged checkpoint they are the average of its members'. Re-estimating
them from training batches without augmentation (:func:`asr.models.norms.recompute_batch_statistics`, as
``torch.optim.swa_utils.update_bn`` does for averaged weights) gives the statistics of the weights in hand.
"""

from __future__ import annotations


def evaluation_dataset(recogniser, utterances):
    """``utterances`` as the trainer's dev set reads them (no augmentation), with ``recogniser``'s
    features and tokenizer, computed where its device wants them (``features.compute_on``)."""
    from asr.data.dataset import SpeechDataset
    from features.config import resolve_compute_on

    config = recogniser.config
    compute_on = resolve_compute_on(config.features.compute_on, recogniser.device.type)
    return SpeechDataset(utterances, recogniser.pipeline, recogniser.tokenizer, train=False, seed=config.data.seed,
                         strict=config.data.strict, compute_on=compute_on)


def recompute_from_training_batches(recogniser, count: int) -> dict:
    """Re-estimate the BatchNorm running statistics of ``recogniser``'s model from the first ``count``
    batches (the recipe's budget and shuffle, its first epoch) of the recipe's training split, without
    augmentation (:func:`asr.models.norms.recompute_batch_statistics`). Returns what went in."""
    from asr.data.batching import BucketBatchSampler, with_features
    from asr.data.corpus import load_split
    from asr.data.dataset import prepare_utterances
    from asr.data.report import DataError, SkipReport
    from asr.models.norms import MaskedBatchNorm1d, recompute_batch_statistics
    from asr.training.data import make_loader

    model, config = recogniser.model, recogniser.config
    if not any(isinstance(m, MaskedBatchNorm1d) for m in model.modules()):
        return {"batches": 0, "utterances": 0}
    report = SkipReport()
    utterances, _ = load_split(config.data, "train", report)
    utterances, _ = prepare_utterances(utterances, config.data, recogniser.tokenizer, report, name="train")
    if not utterances:
        raise DataError(f"--recompute-batchnorm: no usable training utterances (data.train={config.data.train})")
    dataset = evaluation_dataset(recogniser, utterances)
    sampler = BucketBatchSampler(dataset.num_frames(), config.data.max_frames_per_batch, shuffle=True,
                                 seed=config.data.seed)
    batches = list(sampler)[:count]
    seen = {"utterances": 0}
    unreadable = SkipReport()  # in the batches used (what the split's reading left out is logged above)

    def inputs():
        for batch in make_loader(batches, dataset, config.data.num_workers, config.data.seed, pin_memory=False):
            for skip in batch.skipped:
                unreadable.add(skip)
            if len(batch) == 0:
                continue
            batch = batch.to(recogniser.device)
            if batch.audio is not None:
                batch = with_features(batch, recogniser.pipeline)
            seen["utterances"] += len(batch)
            yield batch.features, batch.feature_lengths

    used = recompute_batch_statistics(model, inputs())
    if len(unreadable):
        unreadable.log("the training batches BatchNorm's statistics were re-estimated from")
    return {"batches": used, "utterances": seen["utterances"], "skips": unreadable.as_dict()}
