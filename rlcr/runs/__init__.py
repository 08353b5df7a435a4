"""A run's life outside the method: its store and paths, the writer lease, run references, its task sets,
the task check before a run, the cluster it asks for and the temporary Prefect server (docs/architecture.md)."""
