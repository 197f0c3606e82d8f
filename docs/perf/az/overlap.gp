# zsock_bench overlap: the layout of the AZ-SDP paper's fig. 7. Redraw with: gnuplot overlap.gp
set terminal pngcairo size 1120,440 enhanced font ",10"
set output "overlap.png"
set grid
set key top left
set multiplot layout 1,2 title "Computation and communication overlap (the AZ-SDP paper's fig. 7)"
set xlabel "computation between sends (us)"
set xrange [-10:210]
set yrange [0:*]
set ylabel "throughput (10^9 bytes/s)"
set title "(a) 64Kbyte messages" noenhanced
plot "overlap.dat" index 0 using 1:2 with linespoints lw 2 title "unet bcopy" noenhanced, \
     "overlap.dat" index 1 using 1:2 with linespoints lw 2 title "unet zcopy" noenhanced, \
     "overlap.dat" index 2 using 1:2 with linespoints lw 2 title "unet azcopy" noenhanced, \
     "overlap.dat" index 3 using 1:2 with linespoints lw 2 title "kernel TCP" noenhanced
set title "(b) 1Mbyte messages" noenhanced
plot "overlap.dat" index 4 using 1:2 with linespoints lw 2 title "unet bcopy" noenhanced, \
     "overlap.dat" index 5 using 1:2 with linespoints lw 2 title "unet zcopy" noenhanced, \
     "overlap.dat" index 6 using 1:2 with linespoints lw 2 title "unet azcopy" noenhanced, \
     "overlap.dat" index 7 using 1:2 with linespoints lw 2 title "kernel TCP" noenhanced
unset multiplot
