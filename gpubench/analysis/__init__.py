"""Reading results: the results frame, regression compare, the verdict vocabulary, the advice on
each claim and the recommendation.
"""
