"""The Streamlit explorer: `streamlit run ui/app.py` (or `ncat explore`)."""
