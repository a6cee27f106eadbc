"""What is trained: the public ``Workload`` API, the built-in models, datasets and their storage.
"""
