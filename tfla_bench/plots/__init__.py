"""Figures: the analytic model's (`model_figures`), one run's (`runs`), a run on the model (`measured`)."""
