"""The options of test-time adaptation, apart from the code that runs it: the command line reads them
(for its help) without importing torch. :mod:`asr.inference.adaptation` runs them."""

from __future__ import annotations

from dataclasses import dataclass

ADAPTABLE = ("all", "norms")


@dataclass(frozen=True)
class AdaptationSettings:
    """How each speaker is adapted (the defaults are those measured best in docs/studies/fsdd_loso.md)."""

    rounds: int = 3
    epochs: int = 4        # passes over the speaker's utterances per round
    lr: float = 3e-4
    seed: int = 0          # dropout, augmentation and batch order
    # What is fine-tuned: "all" parameters, or "norms": only the gains and biases of the
    # normalisation layers (LayerNorm, ScaleNorm): a per-speaker re-normalisation that
    # leaves every weight matrix as trained.
    parameters: str = "all"
    # Train only on the transcripts the CTC head's best path agrees with. Off by default: where
    # the CTC head shares the decoder's confusion for a speaker, it keeps the wrong transcripts
    # of that word and drops the right ones, and the rounds then amplify the confusion.
    ctc_agreement: bool = False

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.epochs < 1:
            raise ValueError(f"adaptation needs at least one round and one epoch, got {self.rounds} and {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"the adaptation learning rate must be positive, got {self.lr}")
        if self.parameters not in ADAPTABLE:
            raise ValueError(f"adaptation parameters must be one of {', '.join(ADAPTABLE)}, got {self.parameters!r}")
