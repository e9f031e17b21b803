"""The built-in code task: small function-writing problems scored by running their asserts.

Each row is {"prompt": ..., "tests": [...]}; the `tests` column goes to the `code_tests` reward
(actors/rewards/code_tests.py), which runs the completion's last ```python block against it in a sandbox.
Reference solutions live in `PROBLEMS` (not in the rows, so a policy never sees them) and are checked
against their own tests by the unit tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

PROMPT_TEMPLATE = (
    "Write a Python function `{signature}` that {description}\n"
    "Answer with the complete function in a single ```python fenced code block."
)


@dataclass(frozen=True)
class Problem:
    name: str  # the function's name, used by the tests
    signature: str
    description: str
    tests: tuple[str, ...]
    solution: str  # a reference solution (never in the dataset rows)

    def prompt(self) -> str:
        return PROMPT_TEMPLATE.format(signature=self.signature, description=self.description)


def _p(name: str, args: str, description: str, tests: list[str], solution: str) -> Problem:
    return Problem(name, f"{name}({args})", description, tuple(tests), solution.strip() + "\n")


PROBLEMS: tuple[Problem, ...] = (
    _p("add", "a, b", "returns the sum of the two numbers a and b.",
       ["assert add(1, 2) == 3", "assert add(-4, 4) == 0", "assert add(0, 0) == 0", "assert add(2.5, 0.5) == 3.0"],
       "def add(a, b):\n    return a + b"),
    _p("is_even", "n", "returns True if the integer n is even and False otherwise.",
       ["assert is_even(2) is True", "assert is_even(7) is False", "assert is_even(0) is True",
        "assert is_even(-3) is False"],
       "def is_even(n):\n    return n % 2 == 0"),
    _p("factorial", "n", "returns n! for a non-negative integer n (with factorial(0) == 1).",
       ["assert factorial(0) == 1", "assert factorial(1) == 1", "assert factorial(5) == 120",
        "assert factorial(10) == 3628800"],
       "def factorial(n):\n    out = 1\n    for k in range(2, n + 1):\n        out *= k\n    return out"),
    _p("fibonacci", "n", "returns the n-th Fibonacci number, where fibonacci(0) == 0 and fibonacci(1) == 1.",
       ["assert fibonacci(0) == 0", "assert fibonacci(1) == 1", "assert fibonacci(2) == 1",
        "assert fibonacci(10) == 55", "assert fibonacci(30) == 832040"],
       "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"),
    _p("reverse_string", "s", "returns the string s reversed.",
       ["assert reverse_string('abc') == 'cba'", "assert reverse_string('') == ''",
        "assert reverse_string('racecar') == 'racecar'", "assert reverse_string('ab c') == 'c ba'"],
       "def reverse_string(s):\n    return s[::-1]"),
    _p("is_palindrome", "s",
       "returns True if s reads the same forwards and backwards, ignoring case and any character that is not "
       "a letter or a digit.",
       ["assert is_palindrome('A man, a plan, a canal: Panama') is True", "assert is_palindrome('hello') is False",
        "assert is_palindrome('') is True", "assert is_palindrome('No lemon, no melon') is True"],
       "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]"),
    _p("count_vowels", "s", "returns how many vowels (a, e, i, o, u, upper or lower case) the string s contains.",
       ["assert count_vowels('hello') == 2", "assert count_vowels('') == 0", "assert count_vowels('AEIOU xyz') == 5",
        "assert count_vowels('rhythm') == 0"],
       "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)"),
    _p("largest", "xs", "returns the largest element of the non-empty list of numbers xs.",
       ["assert largest([1, 5, 3]) == 5", "assert largest([-2, -7]) == -2", "assert largest([4]) == 4",
        "assert largest([2.5, 2.4]) == 2.5"],
       "def largest(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n            best = x\n"
       "    return best"),
    _p("second_largest", "xs",
       "returns the second largest distinct value in the list xs, or None if there are fewer than two distinct "
       "values.",
       ["assert second_largest([1, 3, 2]) == 2", "assert second_largest([5, 5, 4]) == 4",
        "assert second_largest([7, 7]) is None", "assert second_largest([]) is None"],
       "def second_largest(xs):\n    vals = sorted(set(xs))\n    return vals[-2] if len(vals) >= 2 else None"),
    _p("gcd", "a, b", "returns the greatest common divisor of the non-negative integers a and b (gcd(0, 0) == 0).",
       ["assert gcd(12, 18) == 6", "assert gcd(7, 13) == 1", "assert gcd(0, 5) == 5", "assert gcd(0, 0) == 0"],
       "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a"),
    _p("lcm", "a, b", "returns the least common multiple of the positive integers a and b.",
       ["assert lcm(4, 6) == 12", "assert lcm(3, 5) == 15", "assert lcm(7, 7) == 7", "assert lcm(1, 9) == 9"],
       "def lcm(a, b):\n    x, y = a, b\n    while y:\n        x, y = y, x % y\n    return a * b // x"),
    _p("is_prime", "n", "returns True if the integer n is a prime number and False otherwise.",
       ["assert is_prime(2) is True", "assert is_prime(1) is False", "assert is_prime(97) is True",
        "assert is_prime(91) is False", "assert is_prime(-7) is False"],
       "def is_prime(n):\n    if n < 2:\n        return False\n    k = 2\n    while k * k <= n:\n"
       "        if n % k == 0:\n            return False\n        k += 1\n    return True"),
    _p("primes_up_to", "n", "returns the list of all prime numbers less than or equal to n, in increasing order.",
       ["assert primes_up_to(10) == [2, 3, 5, 7]", "assert primes_up_to(1) == []", "assert primes_up_to(2) == [2]",
        "assert len(primes_up_to(100)) == 25"],
       "def primes_up_to(n):\n"
       "    return [k for k in range(2, n + 1) if all(k % d for d in range(2, int(k ** 0.5) + 1))]"),
    _p("sum_digits", "n", "returns the sum of the decimal digits of the non-negative integer n.",
       ["assert sum_digits(0) == 0", "assert sum_digits(123) == 6", "assert sum_digits(9999) == 36",
        "assert sum_digits(1000) == 1"],
       "def sum_digits(n):\n    return sum(int(c) for c in str(n))"),
    _p("flatten", "nested", "returns a flat list of all the non-list items of an arbitrarily nested list, in order.",
       ["assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]", "assert flatten([]) == []",
        "assert flatten([[[]]]) == []", "assert flatten(['a', ['b']]) == ['a', 'b']"],
       "def flatten(nested):\n    out = []\n    for x in nested:\n"
       "        out.extend(flatten(x) if isinstance(x, list) else [x])\n    return out"),
    _p("unique_sorted", "xs", "returns the distinct elements of the list xs in increasing order.",
       ["assert unique_sorted([3, 1, 3, 2]) == [1, 2, 3]", "assert unique_sorted([]) == []",
        "assert unique_sorted([5, 5, 5]) == [5]", "assert unique_sorted(['b', 'a']) == ['a', 'b']"],
       "def unique_sorted(xs):\n    return sorted(set(xs))"),
    _p("word_count", "text",
       "returns a dict mapping each whitespace-separated word of text (lower-cased) to how many times it occurs.",
       ["assert word_count('a b a') == {'a': 2, 'b': 1}", "assert word_count('') == {}",
        "assert word_count('The the THE') == {'the': 3}", "assert word_count('x  y\\nx') == {'x': 2, 'y': 1}"],
       "def word_count(text):\n    out = {}\n    for w in text.lower().split():\n        out[w] = out.get(w, 0) + 1\n"
       "    return out"),
    _p("capitalize_words", "s",
       "returns s with the first letter of every space-separated word upper-cased and the rest of each word "
       "unchanged.",
       ["assert capitalize_words('hello world') == 'Hello World'", "assert capitalize_words('') == ''",
        "assert capitalize_words('a bC d') == 'A BC D'", "assert capitalize_words('one') == 'One'"],
       "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))"),
    _p("celsius_to_fahrenheit", "c", "converts a temperature from degrees Celsius to degrees Fahrenheit.",
       ["assert celsius_to_fahrenheit(0) == 32", "assert celsius_to_fahrenheit(100) == 212",
        "assert celsius_to_fahrenheit(-40) == -40", "assert abs(celsius_to_fahrenheit(37) - 98.6) < 1e-9"],
       "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32"),
    _p("fizzbuzz", "n",
       "returns a list of strings for the numbers 1 to n: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, "
       "'FizzBuzz' for multiples of both, and the number itself otherwise.",
       ["assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']", "assert fizzbuzz(0) == []",
        "assert fizzbuzz(15)[-1] == 'FizzBuzz'", "assert len(fizzbuzz(30)) == 30"],
       "def fizzbuzz(n):\n    out = []\n    for k in range(1, n + 1):\n"
       "        out.append('FizzBuzz' if k % 15 == 0 else 'Fizz' if k % 3 == 0 else 'Buzz' if k % 5 == 0 else str(k))\n"
       "    return out"),
    _p("running_sum", "xs", "returns the list of running (prefix) sums of the list of numbers xs.",
       ["assert running_sum([1, 2, 3]) == [1, 3, 6]", "assert running_sum([]) == []",
        "assert running_sum([5]) == [5]", "assert running_sum([1, -1, 1]) == [1, 0, 1]"],
       "def running_sum(xs):\n    out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n"
       "    return out"),
    _p("chunk_list", "xs, size",
       "splits the list xs into consecutive chunks of length size (the last one may be shorter) and returns "
       "them as a list of lists.",
       ["assert chunk_list([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]", "assert chunk_list([], 3) == []",
        "assert chunk_list([1, 2], 5) == [[1, 2]]", "assert chunk_list([1, 2, 3], 1) == [[1], [2], [3]]"],
       "def chunk_list(xs, size):\n    return [xs[i:i + size] for i in range(0, len(xs), size)]"),
    _p("rotate_right", "xs, k",
       "returns the list xs rotated to the right by k positions (k may be larger than the length).",
       ["assert rotate_right([1, 2, 3, 4], 1) == [4, 1, 2, 3]", "assert rotate_right([1, 2, 3], 3) == [1, 2, 3]",
        "assert rotate_right([1, 2, 3], 5) == [2, 3, 1]", "assert rotate_right([], 2) == []"],
       "def rotate_right(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n"
       "    return xs[-k:] + xs[:-k] if k else list(xs)"),
    _p("is_anagram", "a, b",
       "returns True if the strings a and b are anagrams of each other, ignoring spaces and case.",
       ["assert is_anagram('listen', 'silent') is True", "assert is_anagram('Dormitory', 'dirty room') is True",
        "assert is_anagram('abc', 'abd') is False", "assert is_anagram('aab', 'ab') is False"],
       "def is_anagram(a, b):\n    norm = lambda s: sorted(s.replace(' ', '').lower())\n    return norm(a) == norm(b)"),
    _p("binary_to_int", "s", "returns the integer value of the binary string s (made of '0' and '1').",
       ["assert binary_to_int('0') == 0", "assert binary_to_int('101') == 5", "assert binary_to_int('11111111') == 255",
        "assert binary_to_int('1000000000') == 512"],
       "def binary_to_int(s):\n    out = 0\n    for c in s:\n        out = out * 2 + (c == '1')\n    return out"),
    _p("int_to_binary", "n", "returns the binary representation of the non-negative integer n as a string, "
       "without a prefix.",
       ["assert int_to_binary(0) == '0'", "assert int_to_binary(5) == '101'", "assert int_to_binary(255) == '11111111'",
        "assert int_to_binary(1024) == '10000000000'"],
       "def int_to_binary(n):\n    return bin(n)[2:]"),
    _p("count_occurrences", "xs, x", "returns how many times the value x appears in the list xs.",
       ["assert count_occurrences([1, 2, 1, 1], 1) == 3", "assert count_occurrences([], 1) == 0",
        "assert count_occurrences(['a', 'b'], 'c') == 0", "assert count_occurrences([None, None], None) == 2"],
       "def count_occurrences(xs, x):\n    return sum(1 for y in xs if y == x)"),
    _p("merge_sorted", "a, b", "merges the two sorted lists a and b into one sorted list.",
       ["assert merge_sorted([1, 3, 5], [2, 4]) == [1, 2, 3, 4, 5]", "assert merge_sorted([], [1]) == [1]",
        "assert merge_sorted([], []) == []", "assert merge_sorted([1, 1], [1]) == [1, 1, 1]"],
       "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
       "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n"
       "            out.append(b[j])\n            j += 1\n    return out + a[i:] + b[j:]"),
    _p("remove_duplicates", "xs", "returns the list xs without repeated elements, keeping the first occurrence "
       "of each and the original order.",
       ["assert remove_duplicates([3, 1, 3, 2, 1]) == [3, 1, 2]", "assert remove_duplicates([]) == []",
        "assert remove_duplicates(['a', 'a']) == ['a']", "assert remove_duplicates([1, 2, 3]) == [1, 2, 3]"],
       "def remove_duplicates(xs):\n    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n"
       "            seen.add(x)\n            out.append(x)\n    return out"),
    _p("transpose", "matrix", "returns the transpose of a matrix given as a list of equally long rows.",
       ["assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]", "assert transpose([[1, 2, 3]]) == [[1], [2], [3]]",
        "assert transpose([]) == []", "assert transpose([[5]]) == [[5]]"],
       "def transpose(matrix):\n    return [list(col) for col in zip(*matrix)]"),
    _p("dot_product", "u, v", "returns the dot product of two equally long lists of numbers.",
       ["assert dot_product([1, 2, 3], [4, 5, 6]) == 32", "assert dot_product([], []) == 0",
        "assert dot_product([1, -1], [1, 1]) == 0", "assert dot_product([2], [3]) == 6"],
       "def dot_product(u, v):\n    return sum(a * b for a, b in zip(u, v))"),
    _p("roman_to_int", "s", "converts a Roman numeral string (I, V, X, L, C, D, M, with subtractive forms such "
       "as IV and CM) to an integer.",
       ["assert roman_to_int('III') == 3", "assert roman_to_int('IV') == 4", "assert roman_to_int('MCMXCIV') == 1994",
        "assert roman_to_int('LVIII') == 58"],
       "def roman_to_int(s):\n    v = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\n"
       "    total = 0\n    for i, c in enumerate(s):\n        if i + 1 < len(s) and v[c] < v[s[i + 1]]:\n"
       "            total -= v[c]\n        else:\n            total += v[c]\n    return total"),
    _p("int_to_roman", "n", "converts an integer between 1 and 3999 to its Roman numeral string.",
       ["assert int_to_roman(3) == 'III'", "assert int_to_roman(4) == 'IV'", "assert int_to_roman(1994) == 'MCMXCIV'",
        "assert int_to_roman(3999) == 'MMMCMXCIX'"],
       "def int_to_roman(n):\n    pairs = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
       "             (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
       "    out = ''\n    for value, sym in pairs:\n        while n >= value:\n            out += sym\n"
       "            n -= value\n    return out"),
    _p("longest_word", "sentence", "returns the longest space-separated word of sentence (the first one if "
       "several are equally long, '' for an empty sentence).",
       ["assert longest_word('the quick brown fox') == 'quick'", "assert longest_word('') == ''",
        "assert longest_word('a bb cc') == 'bb'", "assert longest_word('hello') == 'hello'"],
       "def longest_word(sentence):\n    best = ''\n    for w in sentence.split():\n        if len(w) > len(best):\n"
       "            best = w\n    return best"),
    _p("caesar_cipher", "s, shift", "shifts every lowercase letter of s by shift positions in the alphabet "
       "(wrapping around from z to a) and leaves other characters unchanged.",
       ["assert caesar_cipher('abc', 1) == 'bcd'", "assert caesar_cipher('xyz', 3) == 'abc'",
        "assert caesar_cipher('hello, world!', 13) == 'uryyb, jbeyq!'", "assert caesar_cipher('abc', 26) == 'abc'"],
       "def caesar_cipher(s, shift):\n    return ''.join(chr((ord(c) - 97 + shift) % 26 + 97) if 'a' <= c <= 'z' else c"
       " for c in s)"),
    _p("balanced_brackets", "s", "returns True if the brackets (), [] and {} in s are balanced and properly "
       "nested; other characters are ignored.",
       ["assert balanced_brackets('([]{})') is True", "assert balanced_brackets('([)]') is False",
        "assert balanced_brackets('') is True", "assert balanced_brackets('((') is False",
        "assert balanced_brackets('a(b)c') is True"],
       "def balanced_brackets(s):\n    pairs = {')': '(', ']': '[', '}': '{'}\n    stack = []\n    for c in s:\n"
       "        if c in '([{':\n            stack.append(c)\n        elif c in pairs:\n"
       "            if not stack or stack.pop() != pairs[c]:\n                return False\n    return not stack"),
    _p("median", "xs", "returns the median of the non-empty list of numbers xs (the mean of the two middle values "
       "when the length is even).",
       ["assert median([3, 1, 2]) == 2", "assert median([4, 1, 3, 2]) == 2.5", "assert median([7]) == 7",
        "assert median([1, 1, 1, 10]) == 1"],
       "def median(xs):\n    s = sorted(xs)\n    m = len(s) // 2\n"
       "    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2"),
    _p("most_common", "xs", "returns the most frequent element of the non-empty list xs; on a tie, the smallest "
       "of the most frequent elements.",
       ["assert most_common([1, 2, 2, 3]) == 2", "assert most_common([3, 1, 3, 1]) == 1",
        "assert most_common([5]) == 5", "assert most_common(['b', 'a', 'b']) == 'b'"],
       "def most_common(xs):\n    counts = {}\n    for x in xs:\n        counts[x] = counts.get(x, 0) + 1\n"
       "    top = max(counts.values())\n    return min(x for x, c in counts.items() if c == top)"),
    _p("count_pairs_with_sum", "xs, target", "returns the number of index pairs i < j with xs[i] + xs[j] == target.",
       ["assert count_pairs_with_sum([1, 2, 3, 4], 5) == 2", "assert count_pairs_with_sum([1, 1, 1], 2) == 3",
        "assert count_pairs_with_sum([], 0) == 0", "assert count_pairs_with_sum([2, 2], 5) == 0"],
       "def count_pairs_with_sum(xs, target):\n    return sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs))"
       " if xs[i] + xs[j] == target)"),
    _p("reverse_digits", "n", "returns the integer whose decimal digits are those of the non-negative integer n "
       "in reverse order (leading zeros dropped).",
       ["assert reverse_digits(123) == 321", "assert reverse_digits(0) == 0", "assert reverse_digits(1200) == 21",
        "assert reverse_digits(7) == 7"],
       "def reverse_digits(n):\n    return int(str(n)[::-1])"),
    _p("char_frequency", "s", "returns a dict mapping each character of s to the number of times it occurs.",
       ["assert char_frequency('aab') == {'a': 2, 'b': 1}", "assert char_frequency('') == {}",
        "assert char_frequency('  ') == {' ': 2}", "assert char_frequency('abc') == {'a': 1, 'b': 1, 'c': 1}"],
       "def char_frequency(s):\n    out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out"),
    _p("run_length_encode", "s", "returns the run-length encoding of s: each run of a repeated character becomes "
       "the character followed by the run length, e.g. 'aaab' -> 'a3b1'.",
       ["assert run_length_encode('aaab') == 'a3b1'", "assert run_length_encode('') == ''",
        "assert run_length_encode('abc') == 'a1b1c1'", "assert run_length_encode('zzzzzz') == 'z6'"],
       "def run_length_encode(s):\n    out, i = '', 0\n    while i < len(s):\n        j = i\n"
       "        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out += s[i] + str(j - i)\n"
       "        i = j\n    return out"),
    _p("count_set_bits", "n", "returns the number of 1 bits in the binary representation of the non-negative "
       "integer n.",
       ["assert count_set_bits(0) == 0", "assert count_set_bits(7) == 3", "assert count_set_bits(8) == 1",
        "assert count_set_bits(255) == 8"],
       "def count_set_bits(n):\n    return bin(n).count('1')"),
    _p("is_leap_year", "year", "returns True if year is a leap year in the Gregorian calendar.",
       ["assert is_leap_year(2024) is True", "assert is_leap_year(1900) is False", "assert is_leap_year(2000) is True",
        "assert is_leap_year(2023) is False"],
       "def is_leap_year(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)"),
    _p("safe_divide", "a, b", "returns a divided by b, or None when b is zero.",
       ["assert safe_divide(6, 3) == 2", "assert safe_divide(1, 0) is None", "assert safe_divide(0, 5) == 0",
        "assert safe_divide(7, 2) == 3.5"],
       "def safe_divide(a, b):\n    return None if b == 0 else a / b"),
    _p("clamp", "x, lo, hi", "returns x limited to the closed interval [lo, hi].",
       ["assert clamp(5, 0, 10) == 5", "assert clamp(-3, 0, 10) == 0", "assert clamp(42, 0, 10) == 10",
        "assert clamp(0, 0, 0) == 0"],
       "def clamp(x, lo, hi):\n    return lo if x < lo else hi if x > hi else x"),
    _p("digital_root", "n", "repeatedly sums the decimal digits of the non-negative integer n until a single "
       "digit remains, and returns it.",
       ["assert digital_root(0) == 0", "assert digital_root(16) == 7", "assert digital_root(942) == 6",
        "assert digital_root(493193) == 2"],
       "def digital_root(n):\n    while n >= 10:\n        n = sum(int(c) for c in str(n))\n    return n"),
)


def code_dataset(seed: int | None = None) -> list[dict[str, Any]]:
    """Rows {"prompt", "tests"}, one per problem (shuffled with `seed` if given; the solutions stay out)."""
    rows = [{"prompt": p.prompt(), "tests": list(p.tests)} for p in PROBLEMS]
    if seed is not None:
        random.Random(seed).shuffle(rows)
    return rows


def reference_solutions() -> dict[str, str]:
    """Problem name -> reference solution source."""
    return {p.name: p.solution for p in PROBLEMS}
