# Draws a step timeline (strata-bench-dsv41 --timeline FILE, cw_timeline.h)
# as stacked bars per decoded token: where each token's wall time went.
#
# usage: gnuplot -e "tl='FILE'; out='timeline.png'" scripts/plot-timeline.gp
#        (optional: run='50%' to draw one budget; default: every row)
# One bar per row of FILE in its order (the first pass, then the warm pass
# of each budget); x labels are run/pass/token.
if (!exists("tl")) tl = 'timeline.tsv'
if (!exists("out")) out = 'timeline.png'
if (!exists("run")) run = ''
set terminal pngcairo size 1600,600 noenhanced
set output out
set datafile separator "\t"
set style data histograms
set style histogram rowstacked
set style fill solid 0.9 border -1
set boxwidth 0.8
set key outside right top
set ylabel "ms per token"
set xtics rotate by 90 font ",7"
set title sprintf("step timeline of %s%s", tl, run eq '' ? '' : ' ('.run.')')
keep(c) = (run eq '' || strcol(1) eq run) ? column(c) : NaN
lab = 'strcol(1)."/".strcol(2)."/".strcol(3)'
plot tl using (keep(5)):xtic(@lab) title "dense" lc rgb "#4e79a7", \
     '' using (keep(6)) title "experts" lc rgb "#59a14f", \
     '' using (keep(7)) title "head" lc rgb "#9c755f", \
     '' using (keep(8)) title "stall demand" lc rgb "#e15759", \
     '' using (keep(9)) title "stall in flight" lc rgb "#f28e2b", \
     '' using (keep(10)) title "ipc" lc rgb "#76b7b2", \
     '' using (keep(11) > 0 ? keep(11) : 0) title "other" lc rgb "#bab0ac"
