"""What a program declares and the vocabulary every runtime part shares: workflow and step
definitions, typed I/O, engine options, engine events, the store an engine names.
"""
