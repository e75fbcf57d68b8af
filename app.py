"""The dashboard's entry for ``streamlit run app.py -- [CASE | SOURCE...]``; the app lives in forensics.dashboard."""

from forensics.dashboard.app import main

main()
