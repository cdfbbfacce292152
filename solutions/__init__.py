"""The complete reference for every graded name of the course, one module per lesson.

Hidden tests compare students' work with these modules. Students never get them. Each
lesson notebook's answer cells hold the same code, and a test keeps the two identical.
"""
