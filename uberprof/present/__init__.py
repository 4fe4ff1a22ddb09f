"""Presentation: renderers that read the analysis' results and never compute metrics."""
