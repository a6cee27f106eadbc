"""What a reader sees: the summary, charts, the memory report and the HTML page.
"""
