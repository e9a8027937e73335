"""What exercises hand out: helpers the learner's graded function may call (`imports.ALLOWED` lets a notebook
import anything from here), one module per exercise. A multi-rank check puts the same helpers in the ranks'
namespace (`register(name, given={...})`), so the function runs there as in the notebook.
None of them is an answer.
"""
