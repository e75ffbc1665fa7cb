# Draws a step timeline (strata run --timeline FILE, computed --timeline,
# strata-bench-dsv --timeline; columns in computed/models/cw_timeline.h)
# as stacked bars, one per step (decoded token): where its wall time went.
#
# usage: gnuplot -e "tl='FILE'; out='timeline.png'" scripts/plot-timeline.gp
#        optional: run='50%' draws only the rows of that run (first column)
# x labels: run/pass/token.  "other" is the wall time no counter explains.
if (!exists("tl")) tl = 'timeline.tsv'
if (!exists("out")) out = 'timeline.png'
if (!exists("run")) run = ''
data = run eq '' ? sprintf("< tail -n +2 '%s'", tl) : \
       sprintf("< awk -F'\t' 'NR > 1 && $1 == \"%s\"' '%s'", run, tl)
set terminal pngcairo size 1600,600 noenhanced
set output out
set datafile separator "\t"
set style data histograms
set style histogram rowstacked
set style fill solid 0.9 border -1
set boxwidth 0.8
set key outside right top
set ylabel "ms per step"
set xtics rotate by 90 right font ",7"
set bmargin 8
set title sprintf("step timeline of %s%s", tl, run eq '' ? '' : ' ('.run.')')
plot data using 5:xtic(strcol(1)."/".strcol(2)."/".strcol(3)) \
          title "dense" lc rgb "#4e79a7", \
     '' using 6 title "experts" lc rgb "#59a14f", \
     '' using 7 title "head" lc rgb "#9c755f", \
     '' using 8 title "stall demand" lc rgb "#e15759", \
     '' using 9 title "stall in flight" lc rgb "#f28e2b", \
     '' using 10 title "ipc (expertd)" lc rgb "#76b7b2", \
     '' using 11 title "kvd" lc rgb "#edc948", \
     '' using ($12 > 0 ? $12 : 0) title "other" lc rgb "#bab0ac"
