"""The sans-IO core: pure data structures, codecs and state machines.

Nothing in this package imports trio, asyncio, sockets or torch; a test enforces it.
"""
