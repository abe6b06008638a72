"""The benchmark's records as a plain-text table (:func:`format_table`), and the command's report."""
from __future__ import annotations

import json
import sys

from ..device import busy_machine_note


def format_table(records: list[dict]) -> str:
    """A plain-text table of the records."""
    head = f"{'method':<24}{'gamma':>6}{'tok/pass':>10}{'alpha':>8}{'tok/s (min-max)':>26}" \
           f"{'speedup (min-max)':>22}{'identical':>11}  verdict"
    lines = [head, "-" * len(head)]
    for r in records:
        a = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
        g = "-" if r["gamma"] is None else str(r["gamma"])
        tps = f"{r['tokens_per_s']:.1f} ({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f})"
        sp = f"{r['speedup_vs_plain']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
        lines.append(f"{r['method']:<24}{g:>6}{r['tokens_per_target_pass']:>10.2f}{a:>8}{tps:>26}{sp:>22}"
                     f"{str(r['identical_to_plain_greedy']):>11}  {_verdict(r)}")
    r0 = records[0]
    for r in records:
        if "ours_over_theirs" in r:
            lines.append(f"{r['method']}: ours ({r['ours']}) / theirs = {r['ours_over_theirs']:.2f}x tokens/s, "
                         f"identical tokens: {r['identical_to_ours']}")
        if "choices" in r:
            lines.append(f"{r['method']} chose: {format_choices(r['choices'])}")
        if "agreement_with_ours" in r:
            parts = [f"{a['prompt']}: " + ("same" if a["first_divergence"] is None else f"from token {a['first_divergence']}")
                     for a in r["agreement_with_ours"]]
            lines.append(f"{r['method']}: 'identical' means identical to {r['reference']}; speed over "
                         f"{r['reference']} {r['speedup_vs_reference']:.2f}x ({r['speedup_vs_reference_min']:.2f}-"
                         f"{r['speedup_vs_reference_max']:.2f}); its tokens agree with our "
                         f"plain greedy output for {r['agreeing_prefix_share']:.0%} of the positions before they part "
                         f"({'; '.join(parts)})")
    groups = [(kind, lambda r, k=kind: r["by_kind"][k]) for kind in r0["by_kind"]] if len(r0["by_kind"]) > 1 else []
    for sp, g in r0.get("by_split", {}).items():
        groups.append((sp, lambda r, s=sp: r["by_split"][s]))
        if len(g["by_kind"]) > 1:
            groups += [(f"{sp} {kind}", lambda r, s=sp, k=kind: r["by_split"][s]["by_kind"][k]) for kind in g["by_kind"]]
    if groups:
        lines.append("per group: tokens per target pass, alpha, speedup over plain (median, min-max over repeats)")
        for label, get in groups:
            lines.append(f"  {label} ({get(r0)['n_prompts']} prompts)")
            for r in records:
                g = get(r)
                a = "-" if g["acceptance_rate"] is None else f"{g['acceptance_rate']:.3f}"
                lines.append(f"    {r['method']:<24}{g['tokens_per_target_pass']:>7.2f}{a:>8}    "
                             f"{g['speedup_vs_plain']:.2f}x ({g['speedup_min']:.2f}-{g['speedup_max']:.2f})  "
                             f"{_verdict(g)}{'' if g['identical_to_plain_greedy'] else '   NOT identical'}")
                if "choices" in g:
                    lines.append(f"      chose: {format_choices(g['choices'])}")
    lines.append(f"{r0['n_prompts']} prompts, {r0['max_new_tokens']} new tokens each (at most), greedy, "
                 f"{r0['repeats']} repeats (medians), device {r0['device']}, {r0['dtype']}, "
                 f"weights {r0.get('precision', 'fp32')}{' (batch-invariant path)' if r0.get('batch_invariant') else ''}, "
                 f"{r0['torch_threads']} threads; alpha = accepted / tested drafted tokens (for the tree methods -- "
                 f"tree, medusa, eagle, lookahead, a lookup tree -- accepted / tree levels tested: level acceptance)")
    lines.append("verdict: each round's speedup over plain against plain's A/A noise band (plain timed twice per "
                 "round), >= 5 repeats (minigpt.verdict)")
    busy = busy_machine_note(r0.get("other_cpu_cores"))
    if busy:
        lines.append(busy)
    return "\n".join(lines)


def format_choices(choices: dict) -> str:
    """``auto``'s choices, most taken first: each option's share of the rounds and its tokens per target pass."""
    return ", ".join(f"{o} {c['share']:.0%} of rounds ({c['tokens_per_pass']:.2f} tokens/pass)"
                     for o, c in sorted(choices.items(), key=lambda kv: -kv[1]["rounds"]))


def _verdict(r: dict) -> str:
    """A record's verdict over plain; for plain, its A/A noise band ("-" for records from before the A/A control)."""
    if "verdict" not in r:
        return "-"
    lo, hi = r["noise_band"]
    return f"A/A noise band {lo:.2f}-{hi:.2f}" if r["verdict"] == "baseline" else r["verdict"]


def report(records: list[dict], json_path: str | None) -> int:
    """Print the table, write the records to ``json_path`` if given; the exit status: 0 when every method
    reproduced plain greedy decoding, else 1."""
    print(format_table(records))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(records, f, indent=2)
        print(f"wrote {json_path}", file=sys.stderr)
    return 0 if all(r["identical_to_plain_greedy"] for r in records) else 1
