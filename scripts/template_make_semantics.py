#!/usr/bin/env python3
"""Generates tests/data/templates/jinja_semantics.json: small templates exercising the Jinja subset
petrel implements (Python str()/repr(), methods, slicing, tests, operators, filters, loops, macros,
whitespace control), each rendered by Python Jinja2 configured as transformers configures it. Cases
with "error" must fail in petrel as well. Checked by tests/jinja_engine_test.cc.

Usage: python3 scripts/template_make_semantics.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from template_make_corpus import DATA, make_environment  # noqa: E402

env = make_environment()
V = {"d": {"b": 1, "a": [1, 2.5, None, True], "items": "key"}, "s": "  Hello, World  ", "n": None, "l": [3, 1, 2], "u": "héllo wörld", "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant"}], "e": ""}
cases = [
 # str() of values
 ("none/bool/int/float", "{{ n }}|{{ true }}|{{ 1 }}|{{ 1.0 }}|{{ 2.50 }}|{{ 1e16 }}|{{ 1e-5 }}|{{ 0.1 + 0.2 }}|{{ -0.0 }}"),
 ("dict and list repr", "{{ d }}|{{ l }}|{{ (1,) }}|{{ () }}|{{ [n, true, 'it\\'s', \"q\\\"\"] }}"),
 ("undefined prints empty", "[{{ missing }}][{{ d.missing }}][{{ msgs[1].content }}]"),
 # methods
 ("strip family", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxaxx'.strip('x') }}]"),
 ("split", "{{ 'a b  c'.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}"),
 ("startswith endswith", "{{ s.strip().startswith('Hell') }}{{ 'abc'.endswith(('x','c')) }}{{ 'abc'.startswith('') }}"),
 ("case", "{{ u.upper() }}|{{ 'HeLLo'.lower() }}|{{ \"they're bill's\".title() }}|{{ 'hELLO world'.capitalize() }}"),
 ("replace", "{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'ab'.replace('', '-') }}|{{ s | replace('l', 'L') }}"),
 ("join and find", "{{ '-'.join(['a','b','c']) }}|{{ u.find('w') }}|{{ u.count('l') }}|{{ 'abc'.find('z') }}"),
 ("dict methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys() | list }}|{{ d.get('zz', 'dflt') }}|{{ d.get('b') }}|{{ d.get('zz') }}"),
 ("attribute vs item", "{{ d['items'] }}|{{ d.b }}|{{ d['b'] }}"),
 # slicing and indexing
 ("slices", "{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[::2] }}{{ u[1:4] }}{{ u[-3:] }}{{ u[::-1] }}{{ l[-1] }}{{ u[1] }}"),
 ("out of range is undefined", "[{{ l[10] }}][{{ l[10] is defined }}][{{ 'ab'[5] is defined }}]"),
 # tests
 ("is tests", "{{ n is none }}{{ d is mapping }}{{ l is iterable }}{{ s is string }}{{ 1 is number }}{{ true is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is boolean }}{{ l is sequence }}{{ missing is defined }}{{ missing is undefined }}{{ 's' is iterable }}"),
 ("comparison tests", "{{ 3 is divisibleby 3 }}{{ 3 is odd }}{{ 4 is even }}{{ 2 is equalto 2 }}{{ 2 is eq(3) }}{{ 'b' is in 'abc' }}{{ 1 is lt 2 }}{{ 'HI' is upper }}{{ 'hi' is lower }}"),
 ("in and not in", "{{ 'a' in 'cat' }}{{ 2 in l }}{{ 'b' in d }}{{ 'zz' not in d }}{{ 'x' in missing }}"),
 # operators
 ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2.0 }} {{ true + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}"),
 ("string ops", "{{ 'ab' ~ 1 ~ none ~ missing }}|{{ 'ab' + 'cd' }}|{{ '-' * 3 }}|{{ [1] + [2] }}|{{ [0] * 2 }}"),
 ("truthiness and/or", "{{ '' or 'x' }}|{{ 'a' and 'b' }}|{{ 0 or [] or 'last' }}|{{ not '' }}|{{ not l }}|{{ missing or 'fallback' }}|{% if e %}T{% else %}F{% endif %}"),
 ("comparisons", "{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 5 }}{{ none == none }}{{ l == [3, 1, 2] }}{{ (1,) == [1] }}"),
 ("inline if", "{{ 'y' if true else 'n' }}{{ 'y' if false else 'n' }}[{{ 'y' if false }}]{{ 'a' if n is none else 'b' }}"),
 ("percent format", "{{ '%s-%d-%05.2f-%%-%r' % ('x', 42, 3.14159, 'q') }}|{{ '%s' % 'one' }}|{{ '%x' | format(255) }}"),
 ("str.format", "{{ '{}+{}={total}'.format(1, 2, total=3) }}|{{ '{0}{0}'.format('ab') }}"),
 # filters
 ("trim length count", "[{{ s | trim }}][{{ s | length }}][{{ l | count }}][{{ u | length }}][{{ missing | length }}][{{ ' x ' | trim(' ') }}]"),
 ("tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ u | tojson }}|{{ 'a\"\\\\\n\t\x01' | tojson }}|{{ [] | tojson(indent=4) }}|{{ {} | tojson }}|{{ d | tojson(sort_keys=true) }}|{{ l | tojson(separators=(',', ':')) }}|{{ u | tojson(ensure_ascii=true) }}"),
 ("default", "{{ missing | default('dflt') }}|{{ e | default('dflt') }}|{{ e | default('dflt', true) }}|{{ n | default('x') }}|{{ missing | d('short') }}"),
 ("join filter", "{{ l | join(', ') }}|{{ msgs | join('/', attribute='role') }}|{{ 'abc' | join('.') }}"),
 ("first last list", "{{ l | first }}{{ l | last }}{{ 'abc' | list }}{{ d | list }}{{ 'xyz' | first }}"),
 ("selectattr rejectattr map", "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}|{{ msgs | rejectattr('content', 'defined') | map(attribute='role') | list }}|{{ msgs | map(attribute='role') | join(',') }}|{{ ['a','B'] | map('upper') | list }}|{{ msgs | selectattr('content') | list | length }}"),
 ("select reject", "{{ [0, 1, 2, '', 'x'] | select | list }}{{ [1, 2, 3, 4] | reject('odd') | list }}{{ [1, 2, 3] | select('gt', 1) | list }}"),
 ("number filters", "{{ '42' | int }}{{ '4.7' | int }}{{ 'x' | int(7) }}{{ '2.5' | float }}{{ -3 | abs }}{{ 2.567 | round(2) }}{{ 2.5 | round }}{{ 3.5 | round }}{{ 2.1 | round(method='ceil') }}{{ 7 | string }}"),
 ("sort unique dictsort", "{{ l | sort }}{{ l | sort(reverse=true) }}{{ ['b', 'A', 'c'] | sort }}{{ ['a', 'A', 'b'] | unique | list }}{{ {'b': 1, 'A': 2} | dictsort }}{{ msgs | sort(attribute='role') | map(attribute='role') | list }}"),
 ("items filter", "{% for k, v in d | items %}{{ k }}:{{ v }},{% endfor %}[{% for k in missing | items %}x{% endfor %}]"),
 ("case filters", "{{ 'hello world' | title }}|{{ 'hello World' | capitalize }}|{{ 'Hi' | upper }}{{ 'Hi' | lower }}|{{ '<a href=\"x\">&\\'</a>' | escape }}|{{ 'x' | safe }}"),
 ("indent", "{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(width='> ', blank=true) }}"),
 ("misc filters", "{{ [1, 2, 3] | sum }}{{ [3, 1, 2] | max }}{{ [3, 1, 2] | min }}{{ 'abc' | reverse }}{{ [1, 2, 3] | reverse | list }}{{ 'one two  three' | wordcount }}{{ [1, 2, 3, 4, 5] | batch(2) | list }}{{ 'abcdefghijklmnopqrstuvwxyz and more words' | truncate(15, leeway=0) }}{{ 'x' | center(5) }}|"),
 # statements
 ("for loop variables", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o', 'e') }};{% endfor %}"),
 ("for else and filter", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in l if x > 1 %}{{ x }}{{ loop.index }}/{{ loop.length }},{% endfor %}|{% for x in l if x > 5 %}x{% else %}none{% endfor %}"),
 ("for over dict and string and unpack", "{% for k in d %}{{ k }},{% endfor %}|{% for c in 'héy' %}[{{ c }}]{% endfor %}|{% for a, b in [[1, 2], (3, 4)] %}{{ a }}{{ b }}{% endfor %}"),
 ("break continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
 ("loop scoping", "{% set c = 0 %}{% for i in range(3) %}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}|{% for i in range(2) %}{% if i == 0 %}{% set z = 5 %}{% endif %}[{{ z }}]{% endfor %}"),
 ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for m in msgs %}{% set ns.count = ns.count + 1 %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }}{{ ns.found }}"),
 ("set in if leaks, tuple set", "{% if true %}{% set x = 'leak' %}{% endif %}{{ x }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set t = 1, 2 %}{{ t }}"),
 ("block set", "{% set block %}  text {{ 1 + 1 }}\n{% endset %}[{{ block }}]"),
 ("macros", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', '?') }} {{ greet(punct='.', name='Cy') }} [{{ greet() }}]"),
 ("recursive macro", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1) | int) }}{% endif %}{% endmacro %}{{ fact(5) }}"),
 ("filter block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}"),
 ("raw", "{% raw %}{{ not rendered }} {% if %}{% endraw %}"),
 ("comments", "a{# a comment #}b{#- trimmed -#}  c"),
 # whitespace control
 ("trim_blocks lstrip_blocks", "<ul>\n    {% for x in [1, 2] %}\n    <li>{{ x }}</li>\n    {% endfor %}\n</ul>\n"),
 ("minus markers", "a  {{- 'b' -}}  c\n  {%- if true -%}\n  d  \n{%- endif %}\n  e {#- x #} f"),
 ("plus markers", "x\n    {%+ if true %}y{% endif +%}\nz\n  {% if true %}\nw\n  {% endif %}"),
 ("variable tags keep indentation", "  {{ 'v' }}\n  {% if true %}B{% endif %}\n"),
 ("trailing newline dropped", "line\n"),
 ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc"),
 ("string escapes", "{{ 'tab\\there' }}|{{ \"new\\nline\" }}|{{ 'uni\\u00e9\\x41' }}|{{ 'keep\\q' }}|{{ 'adj' 'acent' }}"),
 ("numbers", "{{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1.5e3 }} {{ 10 / 4 }}"),
 ("strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %d %j') }}"),
 ("range", "{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ range(5, 0, -2) | list }}{{ range(0) | list }}"),
 ("dict literal and global dict", "{{ {'a': 1, 'b': [1, {'c': none}]} }}|{{ dict(x=1, y='z') }}|{{ {'k': 1, 'k': 2} }}"),
 ("unicode repr", "{{ ['é', '\u200b', '\xa0', '😀', '\x7f', 'it\\'s \"both\"'] }}"),
 ("tojson floats and ints", "{{ [1.0, 0.5, 1e-07, 1e+16, 123456789012345678, -2.5e-310, 3.0e20] | tojson }}"),
]
cases += [
 ("error: attribute of undefined", "{{ missing.attr }}"),
 ("error: item of undefined", "{{ missing['k'] }}"),
 ("error: str + int", "{{ 'a' + 1 }}"),
 ("error: undefined + str", "{{ missing + 'a' }}"),
 ("error: unordered comparison", "{{ 1 < 'a' }}"),
 ("error: in None", "{{ 'x' in n }}"),
 ("error: int in str", "{{ 1 in 'abc' }}"),
 ("error: list.append is unsafe", "{{ l.append(4) }}"),
 ("error: range too big", "{{ range(200000) | length }}"),
 ("error: iterate None", "{% for x in n %}{% endfor %}"),
 ("error: call undefined", "{{ missing(1) }}"),
 ("error: division by zero", "{{ 1 / 0 }}"),
 ("error: length of None", "{{ n | length }}"),
 ("error: tojson of undefined", "{{ missing | tojson }}"),
 ("error: raise_exception", "{{ raise_exception('custom failure') }}"),
 ("error: unpack mismatch", "{% for a, b in [[1, 2, 3]] %}{% endfor %}"),
 ("error: join non-strings with str.join", "{{ ','.join([1, 2]) }}"),
]
out = []
for name, src in cases:
    try:
        out.append({"name": name, "template": src, "expected": env.from_string(src).render(**V)})
    except Exception as e:
        out.append({"name": name, "template": src, "error": type(e).__name__ + ": " + str(e)})
path = os.path.join(DATA, "templates", "jinja_semantics.json")
with open(path, "w", encoding="utf-8", newline="\n") as f:
    json.dump({"variables": V, "cases": out}, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"wrote {len(out)} cases -> {os.path.relpath(path, os.path.dirname(DATA))}")
