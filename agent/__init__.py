"""agentcanvas runtime: load a RAGFlow-style agent DSL and run it, state in one string.

The runtime imports nothing from ``api``: ``Canvas`` works with no database and no
web server. See ``agent.canvas.Canvas``.
"""
