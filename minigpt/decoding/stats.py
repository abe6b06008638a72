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
    # one entry per output token: True if it was drafted and accepted, False if the target made it (a plain
    # step, the bonus token after a full accept, or the replacement at a rejection); see decoding.session.Stream
    from_draft: list[bool] = field(default_factory=list)
    # what a round was made with, when a proposer chooses among several (the speculation controller, .auto):
    # one (option, tokens the round made) per round
    choices: list[tuple[str, int]] = field(default_factory=list)

    def add_round(self, drafted: int, accepted: int, tested: int) -> None:
        """Book one draft-then-verify round: one target pass over ``drafted`` candidates."""
        self.target_passes += 1
        self.rounds += 1
        self.gammas.append(drafted)
        self.proposed += drafted
        self.tested += tested
        self.accepted += accepted

    def add_tree_round(self, parents, path: list[int]) -> None:
        """Book a verified proposal (a tree; a chain is a tree too): the acceptance rule tested one candidate
        level per accepted node, plus the level where it stopped if the last accepted node (or the root) had
        children. For a chain that is min(accepted + 1, drafted)."""
        end = path[-1] if path else 0
        stopped_at_candidates = any(p == end for p in parents)
        self.add_round(len(parents) - 1, len(path), len(path) + int(stopped_at_candidates))

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted / tested drafted tokens -- the course's one meaning of alpha and of "acceptance rate".
        After tree rounds (:meth:`add_tree_round`) a tested "token" is a tree level the rule reached, so the
        same ratio is the trees' level acceptance, not comparable with a chain's alpha."""
        return self.accepted / self.tested if self.tested else float("nan")

    @property
    def share_of_proposed_accepted(self) -> float:
        """accepted / proposed drafted tokens: the share of proposed tokens accepted. Not alpha: the tokens
        proposed after a rejection are never tested, so this is lower wherever long proposals fail early."""
        return self.accepted / self.proposed if self.proposed else float("nan")

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
        d.pop("from_draft")
        d.pop("choices")
        d.update(acceptance_rate=self.acceptance_rate, share_of_proposed_accepted=self.share_of_proposed_accepted,
                 tokens_per_target_pass=self.tokens_per_target_pass,
                 tokens_per_s=self.tokens_per_s)
        return d
