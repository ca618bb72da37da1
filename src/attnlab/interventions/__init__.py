"""What runs a model to measure or change it: long-input and corpus statistics, the induction
probe, ablation and head importance."""
