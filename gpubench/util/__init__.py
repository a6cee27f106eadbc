"""Helpers every layer may use: atomic files, progress, tables, statistics, argument types, time
limits, signals.
"""
