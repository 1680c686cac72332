#!/usr/bin/env python3
"""Per kernel of an `ncu --page source --csv --print-source sass` export: its stall samples by
reason (share of all samples), its SASS instructions and how many of them ran.
Usage: python3 stalls.py source-sass.csv"""
import csv,sys,collections
rows=list(csv.reader(open(sys.argv[1])))
kern=[]; cur=None
for r in rows:
    if r and r[0]=='Kernel Name': cur={'name':r[1],'rows':[]}; kern.append(cur); continue
    if r and r[0]=='Address': cur['hdr']=r; continue
    if cur and r: cur['rows'].append(r)
for k in kern:
    h=k['hdr']; ix={n:i for i,n in enumerate(h)}
    st=[n for n in h if n.startswith('stall_') and 'Not Issued' not in n]
    tot=collections.Counter(); samples=0; execd=0
    for r in k['rows']:
        try: s=int(r[ix['# Samples']])
        except: continue
        samples+=s
        if int(r[ix['Instructions Executed']] or 0)>0: execd+=1
        for n in st: tot[n]+=int(r[ix[n]] or 0)
    print(k['name'], 'samples',samples,'instrs',len(k['rows']),'executed',execd)
    print('   ', ', '.join('%s %.0f%%'%(n[6:],100*v/samples) for n,v in tot.most_common(9)))
