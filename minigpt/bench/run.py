"""Running the benchmark: every method on the same prompts, timed fairly, checked for exactness, summed up per
prompt kind and per prompt set. :func:`run_bench` is the composition of the steps, each a function here:

1. :func:`resolve_params`, :func:`with_our_side` and :func:`peer_race` decide what runs, with which settings;
2. :func:`bench_calls` and :func:`minigpt.device.time_rotating_over` time the calls: after a warm-up, the
   methods run interleaved, prompt by prompt, their order rotating, plain twice per round (its A/A twin, the
   control every verdict is judged against: :mod:`minigpt.verdict`), and every repeat is kept;
3. :func:`check_exactness` compares each output with plain greedy decoding (and with itself across repeats);
4. :func:`method_record` sums up one method (all prompts, ``by_kind``, ``by_split``) and :func:`compare_with_ours`
   adds a transformers method's ratio to our matching one.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from ..decoding import DecodeStats
from ..decoding.auto import choice_summary
from ..device import OtherLoad, get_device, time_rotating_over
from ..engines import agreement
from ..peers import PAIRS, PeerMethod, peer_methods, settings_from_bench
from ..prompts import Prompt, code_prompts, edit_prompts
from ..verdict import aa_band, ratio_interval, speed_verdict, twin_of
from .methods import METHODS, Models

COUNTS = ("new_tokens", "target_passes", "draft_passes", "proposed", "tested", "accepted", "rounds")
TWIN = twin_of("plain")   # plain timed a second time in every round: the A/A control


def check_device(name: str | None) -> torch.device:
    """The device to run on (``None``: :func:`minigpt.get_device`); ValueError in one line if unusable."""
    if name is None:
        return get_device()
    try:
        dev = torch.device(name)
        torch.empty(1, device=dev)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"device {name!r} is not usable here ({first})") from None
    return dev


def check_methods(names) -> list[str]:
    """Validate method names; plain is always included first (it is the baseline)."""
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; available: {', '.join(METHODS)}")
    return ["plain"] + [n for n in dict.fromkeys(names) if n != "plain"]


def bench_prompts(n_code: int, n_edit: int) -> list[Prompt]:
    """The benchmark's prompts: held-out code windows, then copy-heavy edit prompts."""
    return code_prompts(n_code) + edit_prompts(n_edit)


def resolve_params(names: list[str], gamma: int | None = None, overrides: dict | None = None,
                   family: str = "course") -> dict[str, dict]:
    """Each method's parameters: its declared defaults for the model ``family``, ``gamma`` for every method that
    has a draft length, then ``overrides`` (``{"prompt_lookup": {"num_pred": 16}}``; a parameter the method lacks
    is an error)."""
    params = {n: {k: (gamma if k == "gamma" and gamma is not None else v) for k, v in METHODS[n].defaults(family).items()}
              for n in names}
    for n, over in (overrides or {}).items():
        if n in params:
            unknown = set(over) - set(params[n])
            if unknown:
                raise ValueError(f"method {n!r} has no parameter {sorted(unknown)[0]!r}; it has {sorted(params[n])}")
            params[n].update(over)
    return params


def with_our_side(names: list[str], models: Models) -> list[str]:
    """``names`` and our side of each transformers pair (:data:`minigpt.peers.PAIRS`), so that both race; a side
    only when what it needs is loaded (the chain, a draft to assist with)."""
    return names + [ours for ours in PAIRS.values() if ours not in names and not METHODS[ours].missing(models)]


def peer_race(models: Models, names: list[str], params: dict) -> dict[str, PeerMethod]:
    """transformers' decoders (:mod:`minigpt.peers`) for the pairs whose side of ours is in ``names``, with our
    methods' settings (``params``: draft length, n-gram, copied tokens)."""
    theirs = peer_methods(models.target, models.draft, hf_target=models.hf_target, eos_id=models.eos_id,
                          **settings_from_bench(params))
    return {n: fn for n, fn in theirs.items() if PAIRS[n] in names}


def bench_calls(names: list[str], models: Models, params: dict, peer_fns: dict,
                max_new_tokens: int) -> dict[str, Callable]:
    """name -> ``fn(prompt) -> (new ids, DecodeStats)``: a registered method, or one of ``peer_fns``."""
    def ours(name):
        return lambda prompt: METHODS[name].run(models, prompt, max_new_tokens, **params[name])

    def theirs(fn):
        return lambda prompt: (fn(prompt, max_new_tokens), fn.stats)
    return {n: theirs(peer_fns[n]) if n in peer_fns else ours(n) for n in names}


@dataclass
class Race:
    """What the timed runs produced, per method: each prompt's output and counts (from the first repeat),
    whether it matched plain greedy decoding on every repeat, and the seconds of every call
    (``seconds[name][r][i]``: repeat r, prompt i)."""
    outputs: dict
    stats: dict
    identical: dict
    seconds: dict

    def totals(self, name: str, idx) -> DecodeStats:
        """The counts of ``name`` summed over the prompts ``idx``."""
        s = DecodeStats()
        for i in idx:
            for f in COUNTS:
                setattr(s, f, getattr(s, f) + getattr(self.stats[name][i], f))
        return s

    def timing(self, name: str, idx) -> tuple[list[float], list[float]]:
        """Per repeat: the seconds ``name`` spent on the prompts ``idx``, and its speedup over plain on them."""
        t = [sum(row[i] for i in idx) for row in self.seconds[name]]
        return t, [sum(row[i] for i in idx) / tr for row, tr in zip(self.seconds["plain"], t)]


def check_exactness(seconds: dict, results: dict, reference: dict | None = None) -> Race:
    """The :class:`Race` of :func:`minigpt.device.time_rotating_over`'s results (``(ids, stats)`` per call): a
    prompt's output is identical when it equals its reference's (plain decoding's; for a method in
    ``reference``, the method named there) and did not change between repeats (greedy decoding must not)."""
    reference = reference or {}
    outputs = {n: [ids for ids, _ in runs[0]] for n, runs in results.items()}
    stats = {n: [st for _, st in runs[0]] for n, runs in results.items()}
    identical = {n: [all(run[i][0] == out for run in runs) and out == outputs[reference.get(n, "plain")][i]
                     for i, out in enumerate(outputs[n])] for n, runs in results.items()}
    return Race(outputs, stats, identical, seconds)


def _finite(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def verdict_fields(race: Race, name: str, idx) -> dict:
    """The verdict of ``name`` over plain on the prompts ``idx`` (:mod:`minigpt.verdict`): ``noise_band`` from
    plain against its A/A twin in the same rounds (plain's own record also keeps those ``aa_ratios``), the
    paired ratios' judged interval ``speedup_interval`` (their range for 5-7 repeats) and ``verdict``."""
    _, ratios = race.timing(name, idx)
    _, aa = race.timing(TWIN, idx)
    band = aa_band(aa)
    fields = dict(noise_band=list(band), speedup_interval=list(ratio_interval(ratios)),
                  verdict="baseline" if name == "plain" else speed_verdict(ratios, band))
    return dict(fields, aa_ratios=aa) if name == "plain" else fields


def group_summary(race: Race, name: str, idx) -> dict:
    """The counts, times and speedups of ``name`` on the prompts ``idx`` alone (and, for ``auto``, its choices
    there)."""
    s = race.totals(name, idx)
    t, speedups = race.timing(name, idx)
    return dict(n_prompts=len(idx), new_tokens=sum(len(race.outputs[name][i]) for i in idx),
                tokens_per_target_pass=_finite(s.tokens_per_target_pass),
                acceptance_rate=_finite(s.acceptance_rate) if s.tested else None,
                share_of_proposed_accepted=_finite(s.share_of_proposed_accepted) if s.proposed else None,
                time_s_median=statistics.median(t), speedup_vs_plain=statistics.median(speedups),
                speedup_min=min(speedups), speedup_max=max(speedups), **verdict_fields(race, name, idx),
                identical_to_plain_greedy=all(race.identical[name][i] for i in idx), **choices_field(race, name, idx))


def prompt_groups(prompts: list) -> tuple[list[str], dict, dict]:
    """(each prompt's kind, {kind: prompt indices}, {set: prompt indices}): a :class:`~minigpt.prompts.Prompt`'s
    ``kind`` ("code", "edit", ...; "prompt" without one) and ``split`` (e.g. "dev", "held-out"; none: no sets)."""
    kind_of = [getattr(p, "kind", "") or "prompt" for p in prompts]
    of_kind = {kind: [i for i, k in enumerate(kind_of) if k == kind] for kind in sorted(set(kind_of))}
    split_of = [getattr(p, "split", "") for p in prompts]
    of_split = {sp: [i for i, x in enumerate(split_of) if x == sp] for sp in dict.fromkeys(split_of) if sp}
    return kind_of, of_kind, of_split


def method_record(race: Race, name: str, prompts: list, setup: dict, description: str, params: dict) -> dict:
    """One method's record: the totals over all prompts, then ``by_kind`` and ``by_split`` (each set with its
    own ``by_kind``). ``setup``: the run's device, dtype, threads, max_new_tokens and repeats, and
    ``other_cpu_cores``, the cores other processes kept busy during the timed runs
    (:class:`~minigpt.device.OtherLoad`; None where unknown)."""
    s = race.totals(name, range(len(prompts)))
    total_times, speedups = race.timing(name, range(len(prompts)))
    new_tokens = sum(len(o) for o in race.outputs[name])
    tps = [new_tokens / t for t in total_times]
    kind_of, of_kind, of_split = prompt_groups(prompts)
    by_kind = {kind: group_summary(race, name, idx) for kind, idx in of_kind.items()}
    by_split = {sp: dict(group_summary(race, name, idx),
                         by_kind={kind: group_summary(race, name, [i for i in idx if kind_of[i] == kind])
                                  for kind in of_kind if any(kind_of[i] == kind for i in idx)})
                for sp, idx in of_split.items()}
    return dict(
        method=name, description=description, params=params, gamma=params.get("gamma"),
        device=setup["device"], dtype=setup["dtype"], torch_threads=setup["torch_threads"], n_prompts=len(prompts),
        precision=setup["precision"], batch_invariant=setup["batch_invariant"], kernels=setup["kernels"],
        other_cpu_cores=setup["other_cpu_cores"], max_new_tokens=setup["max_new_tokens"], new_tokens=new_tokens,
        repeats=setup["repeats"],
        target_passes=s.target_passes, draft_passes=s.draft_passes, rounds=s.rounds,
        tokens_per_target_pass=_finite(s.tokens_per_target_pass),
        acceptance_rate=_finite(s.acceptance_rate) if s.tested else None,
        share_of_proposed_accepted=_finite(s.share_of_proposed_accepted) if s.proposed else None,
        tokens_per_s=statistics.median(tps), tokens_per_s_min=min(tps), tokens_per_s_max=max(tps),
        time_s_median=statistics.median(total_times), time_s_min=min(total_times), time_s_max=max(total_times),
        speedup_vs_plain=statistics.median(speedups), speedup_min=min(speedups), speedup_max=max(speedups),
        **verdict_fields(race, name, range(len(prompts))), identical_to_plain_greedy=all(race.identical[name]),
        mismatched_prompts=[p.name if isinstance(p, Prompt) else i
                            for i, (p, ok) in enumerate(zip(prompts, race.identical[name])) if not ok],
        by_kind=by_kind, by_split=by_split,
        **choices_field(race, name, range(len(prompts))),
    )


def choices_field(race: Race, name: str, idx) -> dict:
    """``choices``: for a method that chooses among options round by round (``auto``), how often each option was
    taken over the prompts ``idx`` (first repeat) and the tokens per target pass it made; nothing otherwise."""
    rounds = [c for i in idx for c in race.stats[name][i].choices]
    return dict(choices=choice_summary(rounds)) if rounds else {}


def agreement_with_ours(record: dict, race: Race, prompts: list) -> None:
    """Add to a llama.cpp method's record its reference (``llama_plain``: what ``identical_to_plain_greedy`` means
    for it) and, per prompt, where its output first parts from our plain greedy output
    (:func:`minigpt.engines.agreement`)."""
    per = [dict(prompt=p.name if isinstance(p, Prompt) else i,
                **agreement(race.outputs["plain"][i], race.outputs[record["method"]][i]))
           for i, p in enumerate(prompts)]
    compared = sum(a["compared"] for a in per)
    # speedup_vs_plain is against our plain decoding, like every record's; against llama.cpp's own plain too:
    idx = range(len(prompts))
    own = [t_ref / t for t_ref, t in zip(race.timing("llama_plain", idx)[0], race.timing(record["method"], idx)[0])]
    record.update(reference="llama_plain", agreement_with_ours=per,
                  agreeing_prefix_share=sum(a["agreeing_prefix"] for a in per) / compared if compared else None,
                  speedup_vs_reference=statistics.median(own), speedup_vs_reference_min=min(own),
                  speedup_vs_reference_max=max(own))


def compare_with_ours(record: dict, race: Race, prompts: list) -> None:
    """Add to a transformers method's record (and its groups) our matching method (``ours``), whether their
    tokens are identical (``identical_to_ours``) and our tokens/s over theirs (``ours_over_theirs``, median over
    repeats), both measured in the same interleaved runs."""
    theirs, ours = record["method"], PAIRS[record["method"]]

    def against_ours(idx):
        return dict(identical_to_ours=all(race.outputs[theirs][i] == race.outputs[ours][i] for i in idx),
                    ours_over_theirs=statistics.median(
                        t / o for t, o in zip(race.timing(theirs, idx)[0], race.timing(ours, idx)[0])))
    _, of_kind, of_split = prompt_groups(prompts)
    record.update(ours=ours, **against_ours(range(len(prompts))))
    for kind, idx in of_kind.items():
        record["by_kind"][kind].update(against_ours(idx))
    for sp, idx in of_split.items():
        record["by_split"][sp].update(against_ours(idx))


def run_bench(methods=("plain", "chain"), n_code: int = 8, n_edit: int = 4, max_new_tokens: int = 64,
              repeats: int = 5, gamma: int | None = None, device: str | torch.device | None = None,
              models: Models | None = None, prompts: list | None = None, peers: bool = False,
              method_params: dict | None = None, engines: dict | None = None, log=None) -> list[dict]:
    """Run ``methods`` (greedy) on the prompt set; return one record per method (see :mod:`minigpt.bench`).

    ``gamma`` overrides the draft length of every method that has one; ``method_params`` overrides any
    method's parameters (``{"prompt_lookup": {"num_pred": 16}}``). ``models``/``prompts`` replace the
    shipped pair / the default prompt set (tests use this). ``peers``: also run Hugging Face transformers'
    decoders (:mod:`minigpt.peers`) on the same weights, with our matching methods (plain, chain,
    prompt_lookup) added if missing; their records get ``ours_over_theirs`` (our method's tokens/s over theirs,
    median over repeats) and ``identical_to_ours``. ``log``: a function to report progress to.

    Each record's ``by_kind`` repeats the counts, times and speedups for the prompts of each kind alone (the
    ``kind`` of a :class:`~minigpt.prompts.Prompt`), from the same interleaved runs; when the prompts come
    from named sets (a Prompt's ``split``, e.g. "dev" and "held-out"), ``by_split`` does the same for each set,
    with that set's own ``by_kind``.

    ``engines``: llama.cpp's methods (:func:`minigpt.engines.engine_methods`), raced in the same runs. They compute
    with the quantised weights, so they are judged against ``llama_plain`` (``reference``), and their records add
    ``agreement_with_ours``: where their output first parts from our plain greedy output, per prompt."""
    names = check_methods(methods)
    dev = check_device(device) if models is None else models.target.device
    if models is None:
        models = Models.shipped(dev, methods=names)
    if peers:
        names = with_our_side(names, models)
    prompts = prompts if prompts is not None else bench_prompts(n_code, n_edit)
    if not prompts:
        raise ValueError("no prompts to run")
    params = resolve_params(names, gamma, method_params, models.family)
    peer_fns = peer_race(models, names, params) if peers else {}
    engine_fns = dict(engines or {})
    if engine_fns and "llama_plain" not in engine_fns:
        raise ValueError("the engines' race needs llama_plain, their reference")
    outside = {**peer_fns, **engine_fns}
    names += list(outside)
    params.update({n: fn.params for n, fn in outside.items()})
    with OtherLoad() as load:
        seconds, results = time_rotating_over(bench_calls(names, models, params, outside, max_new_tokens), prompts,
                                              dev, repeat=repeats, warmup=1, log=log, aa="plain")
    race = check_exactness(seconds, results, {n: "llama_plain" for n in engine_fns})
    setup = dict(device=str(dev), dtype=str(next(models.target.parameters()).dtype).replace("torch.", ""),
                 torch_threads=torch.get_num_threads(), max_new_tokens=max_new_tokens, repeats=repeats,
                 precision=getattr(models.target, "precision", "fp32"),
                 batch_invariant=getattr(models.target, "batch_invariant", False),
                 kernels=getattr(models.target, "kernels", None), other_cpu_cores=load.cores)
    records = []
    for n in names:
        theirs = outside.get(n)
        description = theirs.description if theirs else METHODS[n].description
        records.append(method_record(race, n, prompts, setup, description, params[n]))
        if n in peer_fns:
            compare_with_ours(records[-1], race, prompts)
        if n in engine_fns:
            agreement_with_ours(records[-1], race, prompts)
    return records
