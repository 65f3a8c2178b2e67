"""Figures: the shared figure type and roofs (`base`), line styles (`style`), one run's figures
(`runs`), a run on the model (`measured`), the analytic model's (`model_figures`), and the one list
of them all (`catalog`)."""
