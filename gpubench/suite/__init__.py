"""What is measured: the curated cases per profile and the claims they answer.
"""
