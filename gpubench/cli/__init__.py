"""The ``gpubench`` commands and the pytest plugins.
"""
