"""Section 3 of the lesson: why scores are divided by √d_k.

Three experiments: the lesson's own check that the standard deviation of q·k grows as √d (its code,
run exactly: ``np.random.default_rng(0)``, 20,000 draws per d); the saturation of softmax without
the division (eight random keys, d_k = 64, 100 draws); and the softmax Jacobian
α_i(δ_ij − α_j), whose norm falls toward 0 as the scores grow.
"""

from __future__ import annotations

import numpy as np

from attnlab.reference.attention import softmax, softmax_jacobian
from attnlab.lesson.fmt import num
from attnlab.lesson.scene import compute_scene
from attnlab.lesson.section import Section, table

STD_DIMS = (1, 2, 64, 512)
STD_DRAWS = 20_000
STD_SEED = 0  # the lesson's code uses np.random.default_rng(0): kept, so its table comes out exactly
SAT_KEYS, SAT_DK, SAT_DRAWS = 8, 64, 100
# Multipliers c on unit-variance scores z: c = 1 is scaled attention, c = √64 = 8 the unscaled one.
GRAD_FACTORS = np.geomspace(0.125, 32.0, 49)
GRAD_TABLE_FACTORS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)

SEED_SCALING = {
    "std": {"1": 1.0, "2": 1.4, "64": 8.0, "512": 22.6},
    "std_scaled": {"1": 1.0, "2": 1.0, "64": 1.0, "512": 1.0},
    "saturation": {"unscaled": 0.89, "scaled": 0.36, "draws": 100, "one_draw": {"unscaled": 0.98, "scaled": 0.35}},
}


def dot_product_std(dims=STD_DIMS, draws: int = STD_DRAWS, seed: int = STD_SEED) -> list[dict]:
    """The lesson's loop, verbatim in substance: one generator, q then k drawn for each d in turn."""
    rng = np.random.default_rng(seed)
    out = []
    for d in dims:
        q = rng.standard_normal((draws, d))
        k = rng.standard_normal((draws, d))
        s = (q * k).sum(axis=1)  # (draws,): the dot products q·k
        out.append({"d": d, "std": float(s.std()), "std_scaled": float((s / np.sqrt(d)).std()), "sqrt_d": float(np.sqrt(d))})
    return out


def saturation(seed: int = 0, keys: int = SAT_KEYS, d_k: int = SAT_DK, draws: int = SAT_DRAWS) -> dict:
    """Largest softmax weight of one random query over ``keys`` random keys, unscaled and scaled."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((draws, 1, d_k))  # (draws, 1, d_k)
    k = rng.standard_normal((draws, keys, d_k))  # (draws, keys, d_k)
    s = (q @ np.swapaxes(k, -1, -2))[:, 0, :]  # (draws, keys)
    top_un = softmax(s).max(axis=-1)
    top_sc = softmax(s / np.sqrt(d_k)).max(axis=-1)
    return {
        "seed": seed,
        "keys": keys,
        "d_k": d_k,
        "draws": draws,
        "unscaled_mean": float(top_un.mean()),
        "scaled_mean": float(top_sc.mean()),
        "unscaled_sem": float(top_un.std(ddof=1) / np.sqrt(draws)),
        "scaled_sem": float(top_sc.std(ddof=1) / np.sqrt(draws)),
        "first_draw": {"unscaled": float(top_un[0]), "scaled": float(top_sc[0])},
        "largest_unscaled": top_un.tolist(),  # (draws,): the largest weight of each draw
        "largest_scaled": top_sc.tolist(),
        "unit_scores": (s / np.sqrt(d_k)).tolist(),  # (draws, keys): z, variance 1, reused for the gradient curve
    }


def gradient_curve(unit_scores: np.ndarray, factors=GRAD_FACTORS) -> dict:
    """Mean Frobenius norm of ∂α/∂s and mean largest weight at s = c·z, for each factor c."""
    z = np.asarray(unit_scores)  # (draws, keys)
    norms, tops = [], []
    for c in factors:
        alpha = softmax(c * z)  # (draws, keys)
        jac = softmax_jacobian(alpha)  # (draws, keys, keys)
        norms.append(float(np.linalg.norm(jac, axis=(-2, -1)).mean()))
        tops.append(float(alpha.max(axis=-1).mean()))
    return {"factors": [float(c) for c in factors], "jacobian_norm": norms, "largest_weight": tops}


def scaling_section(seed: int = 0) -> Section:
    stds = dot_product_std()
    sat = saturation(seed)
    curve = gradient_curve(np.asarray(sat["unit_scores"]))
    table_curve = gradient_curve(np.asarray(sat["unit_scores"]), GRAD_TABLE_FACTORS)
    scene_jac = {
        name: float(np.linalg.norm(softmax_jacobian(compute_scene(scaled).weights)))
        for name, scaled in (("unscaled", False), ("scaled", True))
    }
    seed_sat = SEED_SCALING["saturation"]
    un, sc = round(sat["unscaled_mean"], 2), round(sat["scaled_mean"], 2)
    agree = un == seed_sat["unscaled"] and sc == seed_sat["scaled"]
    # Is the lesson's figure within two standard errors of ours? Said plainly either way.
    within = all(
        abs(sat[f"{name}_mean"] - seed_sat[name]) <= 2 * sat[f"{name}_sem"] for name in ("unscaled", "scaled")
    )
    at = {c: n for c, n in zip(table_curve["factors"], table_curve["jacobian_norm"])}
    findings = (
        "The standard deviation of q·k grows as √d: "
        + ", ".join(f"{num(r['std'], 1)} at d = {r['d']}" for r in stds)
        + "; divided by √d it is " + ", ".join(num(r["std_scaled"], 2) for r in stds) + ".",
        f"Eight random keys, d_k = 64, {sat['draws']} draws (generator seed {seed}): the largest weight averages "
        f"{num(sat['unscaled_mean'])} unscaled and {num(sat['scaled_mean'])} scaled (± {num(sat['unscaled_sem'], 3)} "
        f"and ± {num(sat['scaled_sem'], 3)}, standard errors); the lesson states {seed_sat['unscaled']} and "
        f"{seed_sat['scaled']}"
        + (
            "; the same to two decimals."
            if agree
            else "; our draw differs from the lesson's, "
            + ("within" if within else "by more than")
            + " two standard errors of 100 draws."
        )
        + f" One draw gives {num(sat['first_draw']['unscaled'])} and {num(sat['first_draw']['scaled'])} "
        f"(the lesson's one draw: {seed_sat['one_draw']['unscaled']} and {seed_sat['one_draw']['scaled']}).",
        f"The softmax Jacobian ∂α_i/∂s_j = α_i(δ_ij − α_j) vanishes as the scores grow past unit variance: its norm averages "
        f"{num(at[1.0], 3)} for unit-variance scores (scaled, d_k = 64) and {num(at[8.0], 3)} for the same scores "
        f"× √64 (unscaled). In the scene: {num(scene_jac['unscaled'], 3)} unscaled, {num(scene_jac['scaled'], 3)} scaled.",
    )
    tables = (
        table(
            "Standard deviation of q·k over 20,000 draws (np.random.default_rng(0), as in the lesson)",
            ["d", "std of q·k", "√d", "std of q·k / √d", "the lesson states"],
            [
                [r["d"], num(r["std"], 1), num(r["sqrt_d"], 1), num(r["std_scaled"], 2),
                 f"{SEED_SCALING['std'][str(r['d'])]} / {SEED_SCALING['std_scaled'][str(r['d'])]}"]
                for r in stds
            ],
        ),
        table(
            "Saturation: largest of 8 weights, d_k = 64",
            ["", "unscaled", "scaled", "lesson: unscaled", "lesson: scaled"],
            [
                [f"mean of {sat['draws']} draws", num(sat["unscaled_mean"]), num(sat["scaled_mean"]),
                 num(seed_sat["unscaled"]), num(seed_sat["scaled"])],
                ["one draw", num(sat["first_draw"]["unscaled"]), num(sat["first_draw"]["scaled"]),
                 num(seed_sat["one_draw"]["unscaled"]), num(seed_sat["one_draw"]["scaled"])],
            ],
        ),
        table(
            "Scores c·z (z of variance 1): the slope vanishes as c grows",
            ["factor c", "mean largest weight", "mean ‖∂α/∂s‖"],
            [
                [num(c, 1) + (" (scaled)" if c == 1.0 else " (unscaled, √64)" if c == 8.0 else ""), num(w), num(n, 3)]
                for c, w, n in zip(table_curve["factors"], table_curve["largest_weight"], table_curve["jacobian_norm"])
            ],
        ),
    )
    data = {
        "std": stds,
        "saturation": {k: v for k, v in sat.items() if k != "unit_scores"},
        "gradient": curve,
        "gradient_table": table_curve,
        "scene_jacobian_norm": scene_jac,
        "saturation_matches_seed": agree,
        "saturation_within_two_sem": within,
    }
    return Section("scaling", 3, "Why √d_k", findings, tables, data, SEED_SCALING)
