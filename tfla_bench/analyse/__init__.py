"""Reading finished runs: the paper's published numbers, `compare`, `diff` and the HTML report."""
