"""Processes that run steps: worker and rank pools, torch.distributed set-up.
"""
