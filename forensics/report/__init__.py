"""The report stage: plotly figures shared by the HTML report and the dashboard, and the terminal summary."""
