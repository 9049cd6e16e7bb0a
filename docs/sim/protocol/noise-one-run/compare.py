"""Compare a re-run of the noise experiment with the committed protocol records (see README.md)."""
import json
a = [r for r in json.load(open('docs/sim/protocol/results.json')) if r['experiment'] == 'noise']
b = json.load(open('docs/sim/protocol/noise-one-run/results.json'))
b = [r for r in b if r['experiment'] == 'noise']
k = lambda r: (r['variant'], r['policy'], r['scenario'], r['trial'])
A = {k(r): r for r in a}; B = {k(r): r for r in b}
fields = ['mean', 'p90', 'error_rate', 'arrivals', 'errors', 'events']
same = sum(all(A[x][f] == B[x][f] for f in fields) for x in A if x in B)
print(len(A), len(B), 'identical on', fields, ':', same)
bm = json.load(open('docs/sim/protocol/noise-one-run/benchmark.json'))
pe = bm['per_experiment']['noise']
print('wall_s', round(pe['wall_s'], 1), 'cpu_s', round(pe['cpu_s'], 1), 'pieces', pe.get('pieces'), 'commit', pe.get('commit'), 'code', pe.get('code'))
