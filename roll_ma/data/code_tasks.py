"""A small built-in set of Python tasks with hidden tests (``env.data.source=builtin:code_tasks``).

Each task: ``id``, ``problem`` (what to write, with the function's signature), ``entry_point`` (the
function name), ``solution`` (a reference program, used to check the tests an agent writes) and
``tests`` (hidden ``assert`` lines that decide the reward). 16 tasks train, 4 are held out for
evaluation. Small on purpose: it is the code example's problem set, runnable on any machine; point
``env.data.source`` at a local .jsonl with the same fields (e.g. MBPP or HumanEval converted) for
real work.
"""

from __future__ import annotations


def _task(
    task_id: str, problem: str, entry_point: str, solution: str, tests: list[str], split: str = "train"
):
    return {
        "id": task_id,
        "problem": problem,
        "entry_point": entry_point,
        "solution": solution.strip() + "\n",
        "tests": tests,
        "split": split,
    }


CODE_TASKS: list[dict] = [
    _task(
        "add",
        "Write `add(a, b)` that returns the sum of two integers.",
        "add",
        "def add(a, b):\n    return a + b",
        [
            "assert add(2, 3) == 5",
            "assert add(-4, 4) == 0",
            "assert add(0, 0) == 0",
            "assert add(10, -3) == 7",
        ],
    ),
    _task(
        "reverse_string",
        "Write `reverse_string(s)` that returns the string s reversed.",
        "reverse_string",
        "def reverse_string(s):\n    return s[::-1]",
        [
            "assert reverse_string('abc') == 'cba'",
            "assert reverse_string('') == ''",
            "assert reverse_string('a') == 'a'",
            "assert reverse_string('racecar') == 'racecar'",
        ],
    ),
    _task(
        "is_palindrome",
        "Write `is_palindrome(s)` that returns True when the string s reads the same "
        "backwards, ignoring case.",
        "is_palindrome",
        "def is_palindrome(s):\n    t = s.lower()\n    return t == t[::-1]",
        [
            "assert is_palindrome('Level') is True",
            "assert is_palindrome('abc') is False",
            "assert is_palindrome('') is True",
            "assert is_palindrome('Noon') is True",
        ],
    ),
    _task(
        "factorial",
        "Write `factorial(n)` that returns n! for n >= 0.",
        "factorial",
        "def factorial(n):\n    out = 1\n    for k in range(2, n + 1):\n        out *= k\n    return out",
        [
            "assert factorial(0) == 1",
            "assert factorial(1) == 1",
            "assert factorial(5) == 120",
            "assert factorial(10) == 3628800",
        ],
    ),
    _task(
        "fibonacci",
        "Write `fibonacci(n)` that returns the n-th Fibonacci number (fibonacci(0) == 0, fibonacci(1) == 1).",
        "fibonacci",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        [
            "assert fibonacci(0) == 0",
            "assert fibonacci(1) == 1",
            "assert fibonacci(2) == 1",
            "assert fibonacci(10) == 55",
            "assert fibonacci(20) == 6765",
        ],
    ),
    _task(
        "count_vowels",
        "Write `count_vowels(s)` that returns how many of the characters of s are vowels "
        "(a, e, i, o, u, either case).",
        "count_vowels",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)",
        [
            "assert count_vowels('hello') == 2",
            "assert count_vowels('') == 0",
            "assert count_vowels('xyz') == 0",
            "assert count_vowels('AEIOU') == 5",
        ],
    ),
    _task(
        "max_of_list",
        "Write `max_of_list(xs)` that returns the largest number of a non-empty list without using max().",
        "max_of_list",
        "def max_of_list(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n"
        "            best = x\n    return best",
        [
            "assert max_of_list([1, 5, 3]) == 5",
            "assert max_of_list([-2, -7]) == -2",
            "assert max_of_list([4]) == 4",
            "assert max_of_list([0, 0, 1]) == 1",
        ],
    ),
    _task(
        "sum_of_evens",
        "Write `sum_of_evens(xs)` that returns the sum of the even numbers in the list xs.",
        "sum_of_evens",
        "def sum_of_evens(xs):\n    return sum(x for x in xs if x % 2 == 0)",
        [
            "assert sum_of_evens([1, 2, 3, 4]) == 6",
            "assert sum_of_evens([]) == 0",
            "assert sum_of_evens([1, 3]) == 0",
            "assert sum_of_evens([-2, 2, 5]) == 0",
        ],
    ),
    _task(
        "gcd",
        "Write `gcd(a, b)` that returns the greatest common divisor of two positive integers.",
        "gcd",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a",
        [
            "assert gcd(12, 18) == 6",
            "assert gcd(7, 5) == 1",
            "assert gcd(9, 9) == 9",
            "assert gcd(100, 75) == 25",
        ],
    ),
    _task(
        "is_prime",
        "Write `is_prime(n)` that returns True when the integer n is a prime number.",
        "is_prime",
        "def is_prime(n):\n    if n < 2:\n        return False\n    k = 2\n    while k * k <= n:\n"
        "        if n % k == 0:\n            return False\n        k += 1\n    return True",
        [
            "assert is_prime(2) is True",
            "assert is_prime(1) is False",
            "assert is_prime(15) is False",
            "assert is_prime(97) is True",
            "assert is_prime(0) is False",
        ],
    ),
    _task(
        "flatten",
        "Write `flatten(xss)` that turns a list of lists into one list, in order.",
        "flatten",
        "def flatten(xss):\n    return [x for xs in xss for x in xs]",
        [
            "assert flatten([[1, 2], [3]]) == [1, 2, 3]",
            "assert flatten([]) == []",
            "assert flatten([[], [4], []]) == [4]",
            "assert flatten([['a'], ['b', 'c']]) == ['a', 'b', 'c']",
        ],
    ),
    _task(
        "unique_sorted",
        "Write `unique_sorted(xs)` that returns the distinct values of xs in increasing order.",
        "unique_sorted",
        "def unique_sorted(xs):\n    return sorted(set(xs))",
        [
            "assert unique_sorted([3, 1, 3, 2]) == [1, 2, 3]",
            "assert unique_sorted([]) == []",
            "assert unique_sorted([5, 5]) == [5]",
            "assert unique_sorted([-1, 2, -1]) == [-1, 2]",
        ],
    ),
    _task(
        "word_count",
        "Write `word_count(s)` that returns the number of words in s (words are separated by whitespace).",
        "word_count",
        "def word_count(s):\n    return len(s.split())",
        [
            "assert word_count('hello world') == 2",
            "assert word_count('') == 0",
            "assert word_count('  a  b c ') == 3",
            "assert word_count('one') == 1",
        ],
    ),
    _task(
        "celsius_to_fahrenheit",
        "Write `celsius_to_fahrenheit(c)` that converts a temperature in Celsius to Fahrenheit.",
        "celsius_to_fahrenheit",
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32",
        [
            "assert celsius_to_fahrenheit(0) == 32",
            "assert celsius_to_fahrenheit(100) == 212",
            "assert celsius_to_fahrenheit(-40) == -40",
            "assert abs(celsius_to_fahrenheit(37) - 98.6) < 1e-9",
        ],
    ),
    _task(
        "second_largest",
        "Write `second_largest(xs)` that returns the second largest distinct value of xs "
        "(xs has at least two distinct values).",
        "second_largest",
        "def second_largest(xs):\n    return sorted(set(xs))[-2]",
        [
            "assert second_largest([1, 2, 3]) == 2",
            "assert second_largest([5, 5, 4]) == 4",
            "assert second_largest([-1, -2]) == -2",
            "assert second_largest([10, 3, 10, 7]) == 7",
        ],
    ),
    _task(
        "digit_sum",
        "Write `digit_sum(n)` that returns the sum of the decimal digits of a non-negative integer n.",
        "digit_sum",
        "def digit_sum(n):\n    return sum(int(d) for d in str(n))",
        [
            "assert digit_sum(0) == 0",
            "assert digit_sum(123) == 6",
            "assert digit_sum(9999) == 36",
            "assert digit_sum(105) == 6",
        ],
    ),
    # held out: evaluation only
    _task(
        "capitalize_words",
        "Write `capitalize_words(s)` that upper-cases the first letter of every "
        "space-separated word of s and leaves the rest unchanged.",
        "capitalize_words",
        "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
        [
            "assert capitalize_words('hello world') == 'Hello World'",
            "assert capitalize_words('') == ''",
            "assert capitalize_words('a bC') == 'A BC'",
        ],
        split="eval",
    ),
    _task(
        "running_sum",
        "Write `running_sum(xs)` that returns the list of prefix sums of xs.",
        "running_sum",
        "def running_sum(xs):\n    out, total = [], 0\n    for x in xs:\n        total += x\n"
        "        out.append(total)\n    return out",
        [
            "assert running_sum([1, 2, 3]) == [1, 3, 6]",
            "assert running_sum([]) == []",
            "assert running_sum([5, -5]) == [5, 0]",
        ],
        split="eval",
    ),
    _task(
        "count_char",
        "Write `count_char(s, c)` that returns how many times the character c occurs in s.",
        "count_char",
        "def count_char(s, c):\n    return sum(1 for x in s if x == c)",
        [
            "assert count_char('banana', 'a') == 3",
            "assert count_char('', 'a') == 0",
            "assert count_char('abc', 'z') == 0",
        ],
        split="eval",
    ),
    _task(
        "is_sorted",
        "Write `is_sorted(xs)` that returns True when xs is in non-decreasing order.",
        "is_sorted",
        "def is_sorted(xs):\n    return all(a <= b for a, b in zip(xs, xs[1:]))",
        [
            "assert is_sorted([1, 2, 2, 3]) is True",
            "assert is_sorted([3, 1]) is False",
            "assert is_sorted([]) is True",
        ],
        split="eval",
    ),
]


def code_task_splits() -> tuple[list[dict], list[dict]]:
    """(train, eval) copies of the built-in tasks."""
    train = [dict(t) for t in CODE_TASKS if t["split"] == "train"]
    held = [dict(t) for t in CODE_TASKS if t["split"] == "eval"]
    return train, held


BUILTIN_TASK_SETS = {"code_tasks": code_task_splits}


def load_task_set(name: str) -> tuple[list[dict], list[dict]]:
    """A built-in task set by name ('code_tasks'): (train, eval)."""
    if name not in BUILTIN_TASK_SETS:
        raise ValueError(f"unknown built-in task set {name!r}; known: {sorted(BUILTIN_TASK_SETS)}")
    return BUILTIN_TASK_SETS[name]()
