// One kind of FUSE round trip in a loop, for per-request costs (docs/opens.md, "The cost of each
// request"). Build: gcc -O2 -o req_loops req_loops.c
// usage: req_loops open|read|ioctl|getattr|lookupneg|create|mknod|mkstemp DIR N  (DIR holds a file `f`)
// read: open + read(2) of `f` to its end (1 MiB at a time) + close. Prints the wall and this
// process's CPU time per op.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>

static double cpu(){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static char buf[1<<20];
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(int c,char**v){const char*m=v[1];const char*d=v[2];int n=atoi(v[3]);char p[4096];char f[4096];
 snprintf(f,sizeof f,"%s/f",d);
 double a=now(),ca=cpu();
 if(!strcmp(m,"read")){for(int i=0;i<n;i++){int fd=open(f,O_RDONLY);if(fd<0){perror(f);return 1;}while(read(fd,buf,sizeof buf)>0);close(fd);}}
 else
 if(!strcmp(m,"ioctl")){int fd=open(f,O_RDONLY);struct termios t;for(int i=0;i<n;i++)ioctl(fd,TCGETS,&t);close(fd);}
 else if(!strcmp(m,"open")){for(int i=0;i<n;i++){int fd=open(f,O_RDONLY);if(fd<0){perror(f);return 1;}close(fd);}}
 else if(!strcmp(m,"getattr")){struct statx s;for(int i=0;i<n;i++)if(statx(AT_FDCWD,f,AT_STATX_FORCE_SYNC,STATX_BASIC_STATS,&s)){perror("statx");return 1;}}
 else if(!strcmp(m,"lookupneg")){struct stat s;for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/nx%d_%d",d,getpid(),i);stat(p,&s);}}
 else if(!strcmp(m,"create")){for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/c%d_%d",d,getpid(),i);int fd=open(p,O_CREAT|O_EXCL|O_WRONLY,0644);if(fd<0){perror(p);return 1;}close(fd);} 
   double b=now(),cb=cpu();printf("%.2f us/op cpu %.2f us/op\n",(b-a)/n,(cb-ca)/n);for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/c%d_%d",d,getpid(),i);unlink(p);}return 0;}
 else if(!strcmp(m,"mknod")){for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/m%d_%d",d,getpid(),i);if(mknod(p,S_IFREG|0644,0)){perror(p);return 1;}}
   double b=now(),cb=cpu();printf("%.2f us/op cpu %.2f us/op\n",(b-a)/n,(cb-ca)/n);for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/m%d_%d",d,getpid(),i);unlink(p);}return 0;}
 else if(!strcmp(m,"mkstemp")){for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/tmpXXXXXX",d);int fd=mkstemp(p);if(fd<0){perror(p);return 1;}unlink(p);close(fd);}}
 double b=now(),cb=cpu();printf("%.2f us/op cpu %.2f us/op\n",(b-a)/n,(cb-ca)/n);return 0;}
