"""The script ``forensics dashboard`` hands to ``streamlit run`` (inside the package, so it works after install)."""

from forensics.dashboard.app import main

main()
