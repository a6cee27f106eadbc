"""One training step and the techniques that configure it: ``RunConfig``, precision, parallel
strategies, data loading, building a case, its training check.
"""
