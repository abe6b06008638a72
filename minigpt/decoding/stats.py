"""What a decoding call did: passes of each model, drafted and accepted tokens, wall time."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodeStats:
    new_tokens: int = 0        # tokens generated
    prefills: int = 0          # passes over the prompt (not counted in target_passes)
    target_passes: int = 0     # target passes after the prefill: one per token (plain) or per round
    draft_passes: int = 0      # forward passes of the draft model (0 for drafters without a model)
    proposed: int = 0          # drafted tokens sent to the target
    tested: int = 0            # drafted tokens the acceptance rule looked at (those after a rejection are not)
    accepted: int = 0          # drafted tokens accepted
    rounds: int = 0            # draft-then-verify rounds
    wall_time: float = 0.0     # seconds
    gammas: list[int] = field(default_factory=list)  # draft length used in each round

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted / tested drafted tokens."""
        return self.accepted / self.tested if self.tested else float("nan")

    @property
    def tokens_per_target_pass(self) -> float:
        """Generated tokens per target pass after the prefill (plain decoding: exactly 1)."""
        return self.new_tokens / self.target_passes if self.target_passes else float("nan")

    @property
    def tokens_per_round(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time else float("nan")

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("gammas")
        d.update(acceptance_rate=self.acceptance_rate, tokens_per_target_pass=self.tokens_per_target_pass,
                 tokens_per_s=self.tokens_per_s)
        return d
