"""A sweep report as Markdown, CSV or a lambda plot (the paper's Tables 1-4, Figure 2)."""

from __future__ import annotations

import csv
import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from corel.loss_catalog import short_name


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def _lam(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def rows_by_table(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Every figure of the report as flat rows with a `table` column (for CSV)."""
    rows: list[dict[str, Any]] = []
    for loss, tuning in rep["lambda_tuning"].items():
        for r in tuning["by_lambda"]:
            rows.append({"table": "lambda_tuning", "loss": loss, "lam": r["lam"],
                         "value": r["mean_val"], "std": r["std_val"], "n": r["n"],
                         "tuned": r["lam"] == tuning["tuned_lambda"]})
    for r in rep["test_accuracy"]["rows"]:
        rows.append({"table": "test_accuracy", "loss": r["loss"], "lam": r["lam"], "value": r["mean"],
                     "std": r["std"], "n": r["n"]})
    comparison = rep["test_accuracy"]["comparison"]
    if comparison:
        rows.append({"table": "t_test", "loss": f"{comparison['best']} vs {comparison['runner_up']}",
                     "value": comparison["p"], "statistic": comparison["t"],
                     "significance": comparison["significance"], "n": len(comparison["paired_seeds"])})
    for r in rep["clustering"]:
        for score in ("accuracy", "ari", "v_measure", "silhouette"):
            rows.append({"table": "clustering", "loss": r["loss"], "lam": r["lam"],
                         "algorithm": r["algorithm"], "score": score, "value": r[score], "n": r["n"],
                         "metric": r["metric"]})
            if r.get("paper"):
                rows.append({"table": "clustering_paper", "loss": r["loss"], "algorithm": r["algorithm"],
                             "score": score, "value": r["paper"][score]})
    retrieval = rep.get("retrieval")
    if retrieval:
        for r in retrieval["rows"]:
            rows.append({"table": "map_at_r", "loss": r["loss"], "lam": r["lam"], "value": r["mean"],
                         "std": r["std"], "n": r["n"]})
        c = retrieval["comparison"]
        if c:
            rows.append({"table": "map_at_r_t_test", "loss": f"{c['best']} vs {c['runner_up']}",
                         "value": c["p"], "statistic": c["t"], "significance": c["significance"],
                         "n": len(c["paired_seeds"])})
    return rows


def to_csv(rep: dict[str, Any]) -> str:
    rows = rows_by_table(rep)
    columns = ["table", "loss", "lam", "algorithm", "score", "metric", "value", "std", "statistic",
               "significance", "n", "tuned"]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def to_markdown(rep: dict[str, Any], paper: dict[str, float] | None = None) -> str:
    """Tables 2, 1 and 3-4 of the paper; with ``paper`` (Table 1 figures in %) the
    published test accuracy and the difference in points beside ours."""
    lines = [f"## Sweep {rep['sweep_id']}: {rep['dataset']} / {rep['model']} "
             f"({rep['succeeded']} of {rep['size']} experiments succeeded)", ""]
    lines += ["### Lambda tuning (validation accuracy %, mean over seeds; paper Table 2)", "",
              "| loss | lambda | val acc | std | seeds |", "|---|---|---|---|---|"]
    for loss, tuning in rep["lambda_tuning"].items():
        for r in tuning["by_lambda"]:
            mark = " **(tuned)**" if r["lam"] == tuning["tuned_lambda"] and r["lam"] is not None else ""
            lines.append(f"| {short_name(loss)} | {_lam(r['lam'])}{mark} | "
                         f"{_pct(r['mean_val'])} | {_pct(r['std_val'])} | {r['n']} |")
    lines += ["", "### Test accuracy at the best-validation epoch (%, paper Table 1)", ""]
    header = "| loss | lambda | mean | std | seeds |"
    rule = "|---|---|---|---|---|"
    if paper:
        header += " paper | difference |"
        rule += "---|---|"
    lines += [header, rule]
    for r in rep["test_accuracy"]["rows"]:
        line = (f"| {short_name(r['loss'])} | {_lam(r['lam'])} | {_pct(r['mean'])} | "
                f"{_pct(r['std'])} | {r['n']} |")
        if paper:
            published = paper.get(r["loss"])
            diff = "-" if published is None else f"{100 * r['mean'] - published:+.2f}"
            line += f" {published if published is not None else '-'} | {diff} |"
        lines.append(line)
    c = rep["test_accuracy"]["comparison"]
    if c:
        p = "n/a" if c["p"] is None else f"{c['p']:.3g}"
        lines += ["", f"Paired two-tailed t-test, {short_name(c['best'])} vs "
                  f"{short_name(c['runner_up'])} over {len(c['paired_seeds'])} "
                  f"seeds: p = {p} ({c['significance']})."]
    if rep["clustering"]:
        with_paper = any("paper" in r for r in rep["clustering"])
        lines += ["", "### Clustering of the test latent space (mean over seeds; paper Tables 3-4)", "",
                  "| loss | algorithm | geometry | accuracy | ARI | V-measure | silhouette |"
                  + (" paper accuracy | paper ARI | paper V-measure | paper silhouette |" if with_paper else ""),
                  "|---|---|---|---|---|---|---|" + ("---|---|---|---|" if with_paper else "")]
        for r in rep["clustering"]:
            sil = "-" if r["silhouette"] is None else f"{r['silhouette']:.3f}"
            line = (f"| {short_name(r['loss'])} | {r['algorithm']} | {r['metric']} | "
                    f"{_pct(r['accuracy'])} | {r['ari']:.3f} | {r['v_measure']:.3f} | {sil} |")
            if with_paper:
                paper = r.get("paper")
                line += (" - | - | - | - |" if paper is None else
                         f" {_pct(paper['accuracy'])} | {paper['ari']:.3f} | {paper['v_measure']:.3f} | "
                         f"{paper['silhouette']:.3f} |")
            lines.append(line)
    retrieval = rep.get("retrieval")
    if retrieval and retrieval["rows"]:
        lines += ["", "### Retrieval: MAP@R of the test split among the training split (%, mean over "
                  "seeds; Musgrave et al. 2020)", "", "| loss | lambda | MAP@R | std | seeds |",
                  "|---|---|---|---|---|"]
        for r in retrieval["rows"]:
            lines.append(f"| {short_name(r['loss'])} | {_lam(r['lam'])} | "
                         f"{_pct(r['mean'])} | {_pct(r['std'])} | {r['n']} |")
        c = retrieval["comparison"]
        if c:
            p = "n/a" if c["p"] is None else f"{c['p']:.3g}"
            lines += ["", f"Paired two-tailed t-test of MAP@R, {short_name(c['best'])} "
                      f"vs {short_name(c['runner_up'])} over "
                      f"{len(c['paired_seeds'])} seeds: p = {p} ({c['significance']})."]
    pruning = rep.get("pruning")
    if pruning:
        prune = pruning["prune"]
        lines += ["", f"### Pruned (successive halving on {' and '.join(prune['metric'])}, eta "
                  f"{prune['eta']}, first rung epoch {prune['min_epochs']})", "",
                  "| rung (epoch) | members judged | kept |", "|---|---|---|"]
        lines += [f"| {r['epoch']} | {r['members']} | {r['kept']} |" for r in pruning["rungs"]]
        lines += ["", "| experiment | loss | lambda | seed | rung | why |", "|---|---|---|---|---|---|"]
        lines += [f"| {p['experiment_id']} | {short_name(p['loss'])} | {_lam(p['lam'])} | {p['seed']} | "
                  f"{p['rung']} | {p['reason']} |" for p in pruning["pruned"]]
    return "\n".join(lines) + "\n"


def lambda_png(rep: dict[str, Any], size: tuple[int, int] = (800, 500)) -> bytes:
    """Validation accuracy against lambda per loss (the paper's Figure 2)."""
    dpi = 100
    fig = Figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for loss, tuning in rep["lambda_tuning"].items():
        rows = tuning["by_lambda"]
        label = short_name(loss)
        if len(rows) == 1 and rows[0]["lam"] is None:
            ax.axhline(100 * rows[0]["mean_val"], linestyle="--", color="grey", label=f"{label} (no lambda)")
            continue
        xs = [r["lam"] for r in rows]
        ys = [100 * r["mean_val"] for r in rows]
        ax.plot(xs, ys, marker="o", label=label)
        best = max(rows, key=lambda r: r["mean_val"])
        ax.scatter([best["lam"]], [100 * best["mean_val"]], s=120, facecolors="none", edgecolors="black")
    ax.set_xlabel("lambda")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"Sweep {rep['sweep_id']}: validation accuracy against lambda")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best")
    else:  # no run has finished yet: say so, rather than an empty legend's warning
        ax.text(0.5, 0.5, "no run of this sweep has a validation accuracy yet", ha="center", va="center",
                transform=ax.transAxes, color="grey")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
